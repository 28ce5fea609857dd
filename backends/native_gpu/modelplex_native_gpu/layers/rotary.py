"""Rotary position embedding with a precomputed cos/sin table (default, linear, llama3 and longrope scaling)."""
from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import ModelLoadError


def _inv_freq(rotary_dim: int, theta: float, scaling: dict | None, max_position: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the factor cos/sin are multiplied by (1 except for longrope)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / scaling["factor"], 1.0
    if kind == "llama3":  # smooth interpolation between low and high frequency bands
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(is_mid, mid, scaled), 1.0
    if kind == "longrope":
        return _longrope(rotary_dim, theta, scaling, max_position)
    raise ModelLoadError(f"rope_scaling.rope_type: unsupported value {kind!r}")


def _longrope(rotary_dim: int, theta: float, scaling: dict, max_position: int) -> tuple[torch.Tensor, float]:
    """Phi-3's LongRoPE: per-frequency factors, long ones when the engine's context exceeds the original one
    (llama.cpp's choice, made once per engine; HF switches per call on the sequence's length, which agrees
    whenever no sequence crosses original_max_position_embeddings)."""
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or scaling["max_position_embeddings"] / original
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = torch.tensor(scaling["long_factor" if max_position > original else "short_factor"], dtype=torch.float32)
    if ext.numel() != rotary_dim // 2:
        raise ModelLoadError(f"rope_scaling.short_factor: {ext.numel()} factors for {rotary_dim // 2} frequencies")
    shape = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (ext * theta ** shape), attention_factor


class RotaryEmbedding(nn.Module):
    """Rotates the two halves of each head's first `rotary_dim` dims (HF's rotate_half convention)."""

    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict | None = None,
                 rotary_dim: int | None = None):
        super().__init__()
        self.rotary_dim = rotary_dim or head_dim
        self.is_partial = self.rotary_dim != head_dim
        inv_freq, attention_factor = _inv_freq(self.rotary_dim, theta, scaling, max_position)
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if attention_factor != 1.0:
            cos, sin = cos * attention_factor, sin * attention_factor
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, rotary_dim] for the step's positions: looked up once per step, used by every layer."""
        return self.cos[positions].to(dtype)[:, None, :], self.sin[positions].to(dtype)[:, None, :]

    @staticmethod
    def apply(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate [T, heads, D] (query and key heads side by side: one pass for both) -> a rotated copy.
        With a partial table (cos narrower than D) the dims past it pass through."""
        rotary_dim = cos.shape[-1]
        if rotary_dim == qk.shape[-1]:
            return qk * cos + _rotate_half(qk) * sin
        rot = qk[..., :rotary_dim]
        return torch.cat((rot * cos + _rotate_half(rot) * sin, qk[..., rotary_dim:]), dim=-1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
