"""Llama-family decoder (Llama, Mistral, Qwen2, SmolLM2): RMSNorm, RoPE, GQA, SwiGLU; the layers the other
families share (attention with optional q/k norms, windows and soft-capping; the gated MLP).

Runs on a flattened batch of tokens [T] with positions [T]; attention goes through PagedAttention, one
AttentionMetadata per KV-cache group (`metas[layer.kv_group]`). Weights are loaded from HF-named tensors;
q/k/v and gate/up are fused into one matmul each (checkpoints that store them fused load as they are).
"""
from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelLoadError
from ..layers.attention import AttentionMetadata, PagedAttention
from ..layers.linear import Linear
from ..layers.norm import RMSNorm
from ..layers.quantized import GROUP16_TYPES, QuantizedWeight, embedding, is_quantized_source
from ..layers.rotary import RotaryEmbedding
from .config import ArchConfig

# fused parameter -> the HF tensors it concatenates (rows), when a checkpoint stores them apart
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


_module_swaps = [0]  # submodules set on a decoder layer's modules after construction (LoRA wraps projections)


class _CountsSwaps(nn.Module):
    """Counts the submodules set on it, so a whole-step cache of the layers' weights (LlamaForCausalLM) knows
    when to rebuild without walking every layer each step (nn.Module attribute lookups: ~190 us a step)."""

    def __setattr__(self, name, value):
        if isinstance(value, nn.Module):
            _module_swaps[0] += 1
        super().__setattr__(name, value)


def _param(*shape) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class LlamaAttention(_CountsSwaps):
    def __init__(self, cfg: ArchConfig, kernels: ModuleType, layer_idx: int):
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        scale = cfg.query_pre_attn_scalar ** -0.5 if cfg.query_pre_attn_scalar else None
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, kernels, scale,
                                   cfg.window_of[layer_idx], cfg.attn_logit_softcapping)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, meta: AttentionMetadata,
                ops=None):
        qkv = self.qkv_proj.forward(x)
        num_tokens, qk_size = qkv.shape[0], self.q_size + self.kv_size
        # q and k heads sit side by side in qkv: one rotation covers both.
        qk = qkv[:, :qk_size].view(num_tokens, -1, self.head_dim)
        if self.q_norm is not None:
            heads = self.num_heads
            qk = torch.cat((self.q_norm.forward(qk[:, :heads]), self.k_norm.forward(qk[:, heads:])), 1)
        if ops is None or rope[0].shape[-1] != self.head_dim:
            qk = RotaryEmbedding.apply(qk, *rope)
        else:
            ops.rotary_embedding(qk, *rope)  # in place: qkv (or the normed copy) is this step's own
        q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        v = qkv[:, qk_size:].view(num_tokens, self.num_kv_heads, self.head_dim)
        o = self.attn.forward(q, k, v, meta)
        return self.o_proj.forward(o.reshape(num_tokens, self.q_size))


class LlamaMLP(_CountsSwaps):
    """down(act(gate(x)) * up(x)): SwiGLU with silu, GeGLU with gelu_tanh."""

    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.is_silu = cfg.hidden_act == "silu"

    def forward(self, x: torch.Tensor, ops=None) -> torch.Tensor:
        """With `ops` (the compiled CPU ops), SwiGLU's silu(gate) * up is one fused call (fp32 and bf16)."""
        gate_up, down = self.gate_up_proj, self.down_proj
        # quantized SwiGLU (not wrapped by LoRA, which replaces the Linear modules): one compiled call
        if self.is_silu and type(gate_up) is Linear and gate_up.quantized is not None and type(down) is Linear \
                and down.quantized is not None:
            y = gate_up.quantized.silu_mlp(down.quantized, x)
            if y is not None:
                return y
        y = gate_up.forward(x)
        if ops is not None and self.is_silu and y.dtype in (torch.float32, torch.bfloat16):
            return down.forward(ops.silu_and_mul(y))
        gate, up = y.split(self.intermediate_size, dim=-1)
        return down.forward(self.act(gate).mul_(up))


class LlamaDecoderLayer(_CountsSwaps):
    def __init__(self, cfg: ArchConfig, kernels: ModuleType, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, kernels, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)
        self.kv_group = 0  # which AttentionMetadata (KV-cache group) the layer reads; set by the runner
        self.rope_index = 0  # which of the model's rotary tables it uses
        self._decode_weights = None  # (the linears, quantized_decode_weights() for them)

    def forward(self, rope, x, residual, meta, ops=None):
        """x: the output of the previous layer's MLP (the embeddings at the first layer, where
        `residual` is None); the residual stream is x + residual. -> the same pair for the next layer."""
        if ops is not None and rope[0].shape[-1] == self.self_attn.head_dim:
            if meta.num_decode_tokens == x.shape[0] and x.dtype == torch.float32:
                weights = self.quantized_decode_weights()  # an fp32 op (csrc/decode_layer.cpp)
                if weights is not None:
                    return self._quantized_decode(weights, rope, x, residual, meta, ops)
            dense = self.dense_weights()  # packed fp32 or bf16, any step (csrc/dense_layer.cpp)
            if dense is not None:
                return self._dense_layer(dense, rope, x, residual, meta, ops)
        if residual is None:
            x, residual = self.input_layernorm.norm(x, ops), x
        else:
            x, residual = self.input_layernorm.add_and_norm(x, residual, ops)
        x = self.self_attn.forward(rope, x, meta, ops)
        x, residual = self.post_attention_layernorm.add_and_norm(x, residual, ops)
        return self.mlp.forward(x, ops), residual


    def quantized_decode_weights(self) -> tuple | None:
        """The (blocks, type) of q/k/v, o, gate/up and down when the layer can run as one compiled decode op:
        plain Llama attention and SwiGLU on single-type quantized weights without biases, not wrapped by LoRA
        (which replaces the Linear modules: the answer is kept for the modules it was computed for)."""
        return self._decode_weights_now()[1]

    def dense_weights(self) -> tuple | None:
        """((packed q/k/v, o, gate/up, down), their out_features) when the layer can run as one compiled op
        (any step) on weights packed for our fp32 or bf16 linears, on the terms of `quantized_decode_weights`."""
        return self._decode_weights_now()[2]

    def _decode_weights_now(self) -> tuple:
        attn, mlp = self.self_attn, self.mlp
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if self._decode_weights is None or self._decode_weights[0] != linears:  # modules compare by identity
            self._decode_weights = (linears, *self._find_decode_weights(linears))
        return self._decode_weights

    def _find_decode_weights(self, linears) -> tuple:
        """(quantized, dense) weights for the one-call layer ops; None where the layer cannot use one."""
        attn = self.self_attn
        if type(self) is not LlamaDecoderLayer or attn.q_norm is not None or not self.mlp.is_silu \
                or attn.attn.attention is not attn.attn.kernels \
                or not all(type(m) is Linear and m.bias is None for m in linears):
            return None, None
        if all(m.quantized is not None and len(m.quantized.segments) == 1 for m in linears):
            return tuple(x for m in linears for x in (m.quantized.segments[0].data,
                                                      m.quantized.segments[0].qtype)), None
        if all(m.quantized is None and m.cpu_linear is not None for m in linears) \
                and len({m.packed_weight.dtype for m in linears}) == 1:
            return None, (tuple(m.packed_weight for m in linears), [m.out_features for m in linears])
        return None, None

    def _quantized_decode(self, weights, rope, x, residual, meta, ops):
        """The fp32 decode path of `forward` in one op call (csrc/decode_layer.cpp), bit for bit the same."""
        if residual is None:  # the first layer: residual + zeros is the embeddings exactly
            residual, x = x, torch.zeros_like(x)
        qkv, qkv_type, o, o_type, gate_up, gate_up_type, down, down_type = weights
        attn = self.self_attn
        x = ops.quant_decode_layer(
            x, residual, self.input_layernorm.weight, self.post_attention_layernorm.weight,
            self.input_layernorm.eps, qkv, qkv_type, o, o_type, gate_up, gate_up_type, down, down_type, *rope,
            attn.attn.k_cache, attn.attn.v_cache, meta.slot_mapping, meta.decode_block_tables,
            meta.decode_context_lens, attn.num_heads, attn.num_kv_heads, attn.attn.scale)
        return x, residual

    def _dense_layer(self, weights, rope, x, residual, meta, ops):
        """`forward` on packed fp32 or bf16 weights in one op call (csrc/dense_layer.cpp), bit for bit the same."""
        if residual is None:  # the first layer norms the embeddings, which become the residual stream
            residual, x = x, None
        (qkv, o, gate_up, down), out_features = weights
        attn = self.self_attn
        x = ops.dense_layer(
            x, residual, self.input_layernorm.weight, self.post_attention_layernorm.weight,
            self.input_layernorm.eps, qkv, o, gate_up, down, out_features, *rope, attn.attn.k_cache,
            attn.attn.v_cache, *_layout(meta), attn.num_heads, attn.num_kv_heads, attn.attn.scale)
        return x, residual


class LlamaForCausalLM(_CountsSwaps):
    """Also the base of the other families: they swap `layer_class`, add rotary tables or override
    `embed`, `compute_logits` and `adapt_weight`."""

    layer_class = LlamaDecoderLayer
    # LoRA targets inside each decoder layer: projection -> the PEFT module names of its output slices.
    lora_targets = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "self_attn.o_proj": ("o_proj",),
                    "mlp.gate_up_proj": ("gate_proj", "up_proj"), "mlp.down_proj": ("down_proj",)}

    def __init__(self, cfg: ArchConfig, kernels: ModuleType, max_position: int):
        super().__init__()
        self.config = cfg
        rotary_dim = int(cfg.head_dim * cfg.partial_rotary_factor)
        self.rotaries = nn.ModuleList([RotaryEmbedding(cfg.head_dim, max_position, cfg.rope_theta, cfg.rope_scaling,
                                                       rotary_dim)])
        self.embed_tokens = _param(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(self.layer_class(cfg, kernels, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens
        self.fused_ops = None  # kernels' fused CPU layer ops (torch.ops.modelplex_cpu), set by the runner
        self._step_weights = None  # (_module_swaps when gathered, _gather_step_weights())

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The rows' embeddings (a quantized table dequantizes only the rows looked up)."""
        return embedding(input_ids, self.embed_tokens, self.norm.weight.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metas: list[AttentionMetadata]) -> torch.Tensor:
        x = self.embed(input_ids)
        ropes = [rotary.table(positions, x.dtype) for rotary in self.rotaries]
        # `.forward` rather than calling the modules, here and in the layers: nn.Module's call (hook
        # checks) costs a few microseconds, ~300 times a step; these modules never carry hooks.
        residual, ops = None, self.fused_ops
        if ops is not None and len(metas) == 1:
            decode = metas[0].num_decode_tokens == x.shape[0] and x.dtype == torch.float32
            step = self._decode_step_weights(ropes) if decode else None
            if step is not None:
                return self._decode_step(step, x, ropes[0], metas[0], ops)
            step = self._dense_step_weights(ropes)
            if step is not None:
                return self._dense_step(step, x, ropes[0], metas[0], ops)
        for layer in self.layers:
            x, residual = layer.forward(ropes[layer.rope_index], x, residual, metas[layer.kv_group], ops)
        return x + residual

    def _decode_step_weights(self, ropes) -> tuple | None:
        """Every layer's (norms, weights, types) and attention when the whole step can run as one op call
        (csrc/decode_step.cpp): each layer takes the one-call decode path on the 16-row group layouts."""
        return self._step_weights_now(ropes)[0]

    def _dense_step_weights(self, ropes) -> tuple | None:
        """Every layer's (norms, packed weights) and attention when the whole step can run as one op call
        (csrc/dense_layer.cpp): each layer takes the one-call dense path, all the same shapes."""
        return self._step_weights_now(ropes)[1]

    def _step_weights_now(self, ropes) -> tuple:
        if len(ropes) != 1 or ropes[0][0].shape[-1] != self.config.head_dim:
            return None, None
        if self._step_weights is None or self._step_weights[0] != _module_swaps[0]:
            self._step_weights = (_module_swaps[0], self._gather_step_weights(), self._gather_dense_step_weights())
        return self._step_weights[1:]

    def _gather_step_weights(self) -> tuple | None:
        layers = self.layers
        weights = [layer.quantized_decode_weights() for layer in layers]
        if any(w is None or any(t not in GROUP16_TYPES for t in w[1::2]) for w in weights):
            return None
        if any(layer.rope_index != 0 or layer.kv_group != 0 for layer in layers):
            return None
        return ([layer.input_layernorm.weight for layer in layers], [layer.post_attention_layernorm.weight
                for layer in layers], layers[0].input_layernorm.eps, *([w[i] for w in weights] for i in (0, 2, 4, 6)),
                [t for w in weights for t in w[1::2]], [layer.self_attn.attn for layer in layers])

    def _gather_dense_step_weights(self) -> tuple | None:
        layers = self.layers
        weights = [layer.dense_weights() for layer in layers]
        if any(w is None or w[1] != weights[0][1] for w in weights):
            return None
        if any(layer.rope_index != 0 or layer.kv_group != 0 for layer in layers):
            return None
        return ([layer.input_layernorm.weight for layer in layers], [layer.post_attention_layernorm.weight
                for layer in layers], layers[0].input_layernorm.eps, *([w[0][i] for w in weights] for i in range(4)),
                weights[0][1], [layer.self_attn.attn for layer in layers])

    def _dense_step(self, step, x, rope, meta, ops):
        """All the layers in one op call: bit for bit the layers' own Python path. A step with prefill rows
        returns only its sample rows (where the metadata lists them), whose last layer skips the others."""
        input_norms, post_norms, eps, qkv, o, gate_up, down, out_features, attns = step
        attn = self.layers[0].self_attn
        sample_rows = meta.sample_rows if meta.num_decode_tokens < x.shape[0] else None
        return ops.dense_layers(x, input_norms, post_norms, eps, qkv, o, gate_up, down, out_features, *rope,
                                [a.k_cache for a in attns], [a.v_cache for a in attns], *_layout(meta),
                                attn.num_heads, attn.num_kv_heads, attn.attn.scale, sample_rows)

    def _decode_step(self, step, x, rope, meta, ops):
        """All the layers at decode in one op call: bit for bit the layers' own one-call decode path."""
        input_norms, post_norms, eps, qkv, o, gate_up, down, types, attns = step
        attn = self.layers[0].self_attn
        return ops.quant_decode_layers(x, input_norms, post_norms, eps, qkv, o, gate_up, down, types, *rope,
                                       [a.k_cache for a in attns], [a.v_cache for a in attns], meta.slot_mapping,
                                       meta.decode_block_tables, meta.decode_context_lens, attn.num_heads,
                                       attn.num_kv_heads, attn.attn.scale)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head on the rows that sample; logits are fp32 for the sampler."""
        return self.lm_head.forward_fp32(self.norm.norm(hidden.contiguous(), self.fused_ops))

    def pack_linear_weights(self, batch_size_hint: int, cpu_ops=None):
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack(batch_size_hint, keep_weight=module.weight is self.embed_tokens, cpu_ops=cpu_ops)

    def adapt_weight(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """An HF tensor as this model's parameter holds it (Gemma: norms with their +1)."""
        return tensor

    def load_weights(self, weights: dict[str, torch.Tensor]) -> list[str]:
        """Copy HF-named tensors (model.layers.N.self_attn.q_proj.weight, ...) into the parameters, fusing
        q/k/v and gate/up where the checkpoint keeps them apart. Returns the names left unused."""
        weights = dict(weights)  # popped as consumed; the caller's dict stays whole
        with torch.no_grad():
            linears = {name: m for name, m in self.named_modules() if isinstance(m, Linear)}
            for name, param in list(self.named_parameters()):  # a tied LM head is the embedding: listed once
                hf_name = ("model.embed_tokens.weight" if name == "embed_tokens" else
                           name if name.startswith("lm_head.") else "model." + name)
                module, _, kind = name.rpartition(".")
                if name == "embed_tokens":
                    (table,) = _take_parts(weights, hf_name)
                    self._load_embedding(table if is_quantized_source(table) else self.adapt_weight(hf_name, table))
                elif kind == "weight" and module in linears:
                    parts = _take_parts(weights, hf_name)
                    if not any(is_quantized_source(w) for w in parts):
                        parts = [self.adapt_weight(hf_name, torch.cat(parts) if len(parts) > 1 else parts[0])]
                    linears[module].load(parts)  # quantized parts stay in their blocks
                else:
                    param.copy_(self.adapt_weight(hf_name, _take(weights, hf_name)))
        weights.pop("lm_head.weight", None)  # tied checkpoints may carry a copy
        return [k for k in weights if not k.endswith("rotary_emb.inv_freq")]

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


def _layout(meta: AttentionMetadata) -> tuple:
    """The step's layout as csrc/dense_layer.cpp's ops take it."""
    return (meta.slot_mapping, meta.num_decode_tokens, meta.decode_block_tables, meta.decode_context_lens,
            meta.prefill_block_tables, meta.prefill_cu_seqlens_q, meta.prefill_context_lens)


def _take_parts(weights: dict, hf_name: str) -> list:
    """The tensor `hf_name` as a list of row slices: itself, or the HF tensors a fused parameter concatenates
    (not concatenated here: quantized ones are read slice by slice into their place)."""
    if hf_name in weights:
        return [_read(weights.pop(hf_name))]
    prefix, module, kind = hf_name.rsplit(".", 2)
    parts = [f"{prefix}.{part}.{kind}" for part in _FUSED.get(module, ())]
    missing = [p for p in parts if p not in weights] if parts else [hf_name]
    if missing:
        raise ModelLoadError(f"checkpoint tensor {missing[0]!r} is missing")
    return [_read(weights.pop(p)) for p in parts]


def _read(w):
    """A tensor left in its file (loader/hf.py's SafetensorsTensor) is read when its parameter takes it;
    tensors and quantized sources pass as they are."""
    return w.load() if hasattr(w, "load") else w


def _take(weights: dict[str, torch.Tensor], hf_name: str) -> torch.Tensor:
    parts = _take_parts(weights, hf_name)
    if any(is_quantized_source(w) for w in parts):
        raise ModelLoadError(f"checkpoint tensor {hf_name!r} is quantized, which this parameter cannot hold")
    return torch.cat(parts) if len(parts) > 1 else parts[0]
