"""Phi-3 / 3.5 / 4-mini: Llama's layers with q/k/v and gate/up stored fused in the checkpoint (loaded as
they are), LongRoPE scaling (layers/rotary.py), partial rotary dims (Phi-4-mini) and an optional sliding
window over every layer.
"""
from __future__ import annotations

from .llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    """Llama with HF names self_attn.qkv_proj and mlp.gate_up_proj: the fused parameters' own."""
