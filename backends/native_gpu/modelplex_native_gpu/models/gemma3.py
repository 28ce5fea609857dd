"""Gemma 3 (text): Gemma 2's layers plus RMSNorm on each query and key head (with Gemma's +1), and two RoPE
tables: the global layers' base (and scaling) and the sliding layers' local base. Soft-capping is off in
released checkpoints but honoured when a config sets it.
"""
from __future__ import annotations

from ..layers.rotary import RotaryEmbedding
from .gemma2 import Gemma2ForCausalLM


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    def __init__(self, cfg, kernels, max_position: int):
        super().__init__(cfg, kernels, max_position)
        theta = cfg.local_rope_theta or cfg.rope_theta
        self.rotaries.append(RotaryEmbedding(cfg.head_dim, max_position, theta, cfg.local_rope_scaling))
        for layer, window in zip(self.layers, cfg.window_of):
            layer.rope_index = 0 if window is None else 1
