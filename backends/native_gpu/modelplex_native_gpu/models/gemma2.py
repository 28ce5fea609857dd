"""Gemma 2: scaled embeddings, RMSNorm with the +1 offset, a norm after attention and after the MLP as
well as before each, GeGLU, attention and final logit soft-capping, sliding-window layers alternating
with global ones, tied embeddings, and attention scaled by query_pre_attn_scalar.
"""
from __future__ import annotations

import torch
from torch import nn

from ..layers.norm import RMSNorm
from .llama import LlamaAttention, LlamaForCausalLM, LlamaMLP


class Gemma2DecoderLayer(nn.Module):
    def __init__(self, cfg, kernels, layer_idx: int):
        super().__init__()
        eps = cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.self_attn = LlamaAttention(cfg, kernels, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.mlp = LlamaMLP(cfg)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.kv_group = 0
        self.rope_index = 0

    def forward(self, rope, x, residual, meta, ops=None):
        """The (x, residual) pair of LlamaDecoderLayer: the residual stream is x + residual."""
        if residual is None:
            x, residual = self.input_layernorm.norm(x, ops), x
        else:
            x, residual = self.input_layernorm.add_and_norm(x, residual, ops)
        x = self.post_attention_layernorm.norm(self.self_attn.forward(rope, x, meta, ops), ops)
        x, residual = self.pre_feedforward_layernorm.add_and_norm(x, residual, ops)
        return self.post_feedforward_layernorm.norm(self.mlp.forward(x), ops), residual


class Gemma2ForCausalLM(LlamaForCausalLM):
    layer_class = Gemma2DecoderLayer

    def __init__(self, cfg, kernels, max_position: int):
        super().__init__(cfg, kernels, max_position)
        # A plain attribute (a buffer would be rounded by model.to(dtype)); cast per call as HF does.
        self.embed_scale = torch.tensor(cfg.hidden_size ** 0.5)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = super().embed(input_ids)
        return x * self.embed_scale.to(device=x.device, dtype=x.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def adapt_weight(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Gemma's RMSNorm multiplies by (1 + weight): held as one weight, the shared RMSNorm's product."""
        return tensor.float() + 1.0 if name.endswith("norm.weight") else tensor
