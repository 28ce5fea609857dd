"""Llama-family decoder (Llama, Mistral, Qwen2, SmolLM2): RMSNorm, RoPE, GQA, SwiGLU.

Runs on a flattened batch of tokens [T] with positions [T]; attention goes through PagedAttention.
Weights are loaded from HF-named tensors; q/k/v and gate/up are fused into one matmul each.
"""
from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.attention import AttentionMetadata, PagedAttention
from ..layers.linear import Linear
from ..layers.norm import RMSNorm
from ..layers.quantized import QuantizedWeight, embedding, is_quantized_source
from ..layers.rotary import RotaryEmbedding
from .config import LlamaArchConfig


def _param(*shape) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaArchConfig, kernels: ModuleType):
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, kernels)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, meta: AttentionMetadata,
                ops=None):
        qkv = self.qkv_proj.forward(x)
        num_tokens, qk_size = qkv.shape[0], self.q_size + self.kv_size
        # q and k heads sit side by side in qkv: one rotation covers both.
        qk = qkv[:, :qk_size].view(num_tokens, -1, self.head_dim)
        if ops is None:
            qk = RotaryEmbedding.apply(qk, *rope)
        else:
            ops.rotary_embedding(qk, *rope)  # in place: qkv is this step's own
        q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        v = qkv[:, qk_size:].view(num_tokens, self.num_kv_heads, self.head_dim)
        o = self.attn.forward(q, k, v, meta)
        return self.o_proj.forward(o.reshape(num_tokens, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaArchConfig):
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.forward(x).split(self.intermediate_size, dim=-1)
        return self.down_proj.forward(F.silu(gate).mul_(up))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaArchConfig, kernels: ModuleType):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, kernels)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, rope, x, residual, meta, ops=None):
        """x: the output of the previous layer's MLP (the embeddings at the first layer, where
        `residual` is None); the residual stream is x + residual. -> the same pair for the next layer."""
        if residual is None:
            x, residual = self.input_layernorm.norm(x, ops), x
        else:
            x, residual = self.input_layernorm.add_and_norm(x, residual, ops)
        x = self.self_attn.forward(rope, x, meta, ops)
        x, residual = self.post_attention_layernorm.add_and_norm(x, residual, ops)
        return self.mlp.forward(x), residual


class LlamaForCausalLM(nn.Module):
    # LoRA targets inside each decoder layer: projection -> the PEFT module names of its output slices.
    lora_targets = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "self_attn.o_proj": ("o_proj",),
                    "mlp.gate_up_proj": ("gate_proj", "up_proj"), "mlp.down_proj": ("down_proj",)}

    def __init__(self, cfg: LlamaArchConfig, kernels: ModuleType, max_position: int):
        super().__init__()
        self.config = cfg
        self.rotary = RotaryEmbedding(cfg.head_dim, max_position, cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = _param(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, kernels) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens
        self.fused_ops = None  # kernels' fused CPU layer ops (torch.ops.modelplex_cpu), set by the runner

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        x = embedding(input_ids, self.embed_tokens, self.norm.weight.dtype)
        rope = self.rotary.table(positions, x.dtype)
        # `.forward` rather than calling the modules, here and in the layers: nn.Module's call (hook
        # checks) costs a few microseconds, ~300 times a step; these modules never carry hooks.
        residual, ops = None, self.fused_ops
        for layer in self.layers:
            x, residual = layer.forward(rope, x, residual, meta, ops)
        return x + residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head on the rows that sample; logits are fp32 for the sampler."""
        return self.lm_head(self.norm(hidden)).float()

    def pack_linear_weights(self, batch_size_hint: int, cpu_ops=None):
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack(batch_size_hint, keep_weight=module.weight is self.embed_tokens, cpu_ops=cpu_ops)

    def load_weights(self, weights: dict[str, torch.Tensor]):
        """Copy HF-named tensors (model.layers.N.self_attn.q_proj.weight, ...) into the fused parameters."""
        weights = dict(weights)  # popped as consumed; the caller's dict stays whole
        get = weights.pop
        with torch.no_grad():
            self._load_embedding(get("model.embed_tokens.weight"))
            self.norm.weight.copy_(get("model.norm.weight"))
            if not self.config.tie_word_embeddings:
                self.lm_head.load([get("lm_head.weight")])
            for i, layer in enumerate(self.layers):
                p = f"model.layers.{i}."
                attn = layer.self_attn
                attn.qkv_proj.load([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
                if attn.qkv_proj.bias is not None:
                    attn.qkv_proj.bias.copy_(torch.cat([get(p + f"self_attn.{n}_proj.bias") for n in "qkv"]))
                attn.o_proj.load([get(p + "self_attn.o_proj.weight")])
                mlp = layer.mlp
                mlp.gate_up_proj.load([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
                mlp.down_proj.load([get(p + "mlp.down_proj.weight")])
                layer.input_layernorm.weight.copy_(get(p + "input_layernorm.weight"))
                layer.post_attention_layernorm.weight.copy_(get(p + "post_attention_layernorm.weight"))
        weights.pop("lm_head.weight", None)  # tied checkpoints may carry a copy
        unused = [k for k in weights if not k.endswith("rotary_emb.inv_freq")]
        return unused

    def _load_embedding(self, table) -> None:
        """A quantized table stays in the file's format (a step dequantizes the rows it looks up; a tied LM
        head multiplies with the same blocks); a float one is copied into the parameter."""
        if not is_quantized_source(table):
            self.embed_tokens.copy_(table)
            return
        del self.embed_tokens  # the fp32 parameter (never written: no memory behind it) goes
        self.embed_tokens = QuantizedWeight.read([table])
        if self.config.tie_word_embeddings:
            self.lm_head.load([self.embed_tokens])
