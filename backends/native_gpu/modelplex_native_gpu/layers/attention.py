"""Paged attention layer: writes this step's K/V into the cache, then attends over the cache.

The step's tokens are flattened with all decode tokens (one per sequence) first; decodes go
through the paged decode kernel in one call, the rest through the prefix-prefill kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn


@dataclass
class AttentionMetadata:
    """Everything a layer needs about the step's batch layout (built once per step by the runner)."""

    slot_mapping: torch.Tensor  # [T] cache slot of each token
    num_decode_tokens: int
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks]
    decode_context_lens: torch.Tensor | None  # [num_decodes]
    prefill_block_tables: torch.Tensor | None  # [num_prefills, max_blocks]
    prefill_cu_seqlens_q: torch.Tensor | None  # [num_prefills + 1], relative to the first prefill token
    prefill_context_lens: torch.Tensor | None  # [num_prefills]
    max_prefill_query_len: int
    decode_plan: object = None  # kernels.plan_decode(...) for the decode rows, shared by all layers


class PagedAttention(nn.Module):
    """Holds one layer's cache views; `kernels` is kernels.reference (CPU) or kernels.triton_attention."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, kernels: ModuleType):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5
        self.kernels = kernels
        self.k_cache = self.v_cache = torch.empty(0)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] -> [T, H, D]."""
        ops = self.kernels
        ops.store_kvcache(k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        nd = meta.num_decode_tokens
        if nd == q.shape[0]:
            return ops.paged_decode_attention(q, self.k_cache, self.v_cache, meta.decode_block_tables,
                                              meta.decode_context_lens, self.scale, meta.decode_plan)
        prefill = ops.prefix_prefill_attention(q[nd:], self.k_cache, self.v_cache, meta.prefill_block_tables,
                                               meta.prefill_cu_seqlens_q, meta.prefill_context_lens, self.scale,
                                               meta.max_prefill_query_len, k[nd:], v[nd:])
        if nd == 0:
            return prefill
        decode = ops.paged_decode_attention(q[:nd], self.k_cache, self.v_cache, meta.decode_block_tables,
                                            meta.decode_context_lens, self.scale, meta.decode_plan)
        return torch.cat((decode, prefill))
