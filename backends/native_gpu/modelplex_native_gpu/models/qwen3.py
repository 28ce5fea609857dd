"""Qwen3: Llama with an RMSNorm over each query and key head before RoPE (no q/k/v biases).

The norms live in the shared LlamaAttention (`ArchConfig.qk_norm`); sliding windows, when a config turns
them on through `layer_types`, in the shared PagedAttention.
"""
from __future__ import annotations

from .llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Llama's layers and weight names plus self_attn.q_norm / k_norm."""
