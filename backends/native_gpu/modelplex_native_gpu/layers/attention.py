"""Paged attention layer: writes this step's K/V into the cache, then attends over the cache.

The step's tokens are flattened with all decode tokens (one per sequence) first; decodes go
through the paged decode kernel in one call, the rest through the prefix-prefill kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from ..kernels import reference


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
    # The rows whose hidden states the step reads after the model (those that sample), ascending; a model may
    # return only these rows. None: every row is read (prompt logprobs).
    sample_rows: torch.Tensor | None = None


class PagedAttention(nn.Module):
    """Holds one layer's cache views; `kernels` is kernels.cpu (CPU) or kernels.triton_attention (CUDA).

    A sliding window (the query attends to the last `sliding_window` positions, itself included) or a
    logit soft-cap (tanh(score / softcap) * softcap, Gemma 2) runs the torch reference attention, on either
    device: the compiled CPU op and the Triton kernels take neither. K/V are still written by `kernels`.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, kernels: ModuleType,
                 scale: float | None = None, sliding_window: int | None = None, softcap: float | None = None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.kernels = kernels
        self.sliding_window, self.softcap = sliding_window, softcap
        self.attention = reference if sliding_window or softcap else kernels
        self.k_cache = self.v_cache = torch.empty(0)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] -> [T, H, D]."""
        self.kernels.store_kvcache(k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        nd = meta.num_decode_tokens
        if nd == q.shape[0]:
            return self._decode(q, meta)
        extra = {} if self.attention is self.kernels else {"sliding_window": self.sliding_window,
                                                           "softcap": self.softcap}
        prefill = self.attention.prefix_prefill_attention(
            q[nd:], self.k_cache, self.v_cache, meta.prefill_block_tables, meta.prefill_cu_seqlens_q,
            meta.prefill_context_lens, self.scale, meta.max_prefill_query_len, k[nd:], v[nd:], **extra)
        if nd == 0:
            return prefill
        return torch.cat((self._decode(q[:nd], meta), prefill))

    def _decode(self, q: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        if self.attention is self.kernels:
            return self.kernels.paged_decode_attention(q, self.k_cache, self.v_cache, meta.decode_block_tables,
                                                       meta.decode_context_lens, self.scale, meta.decode_plan)
        # The step's plan belongs to `kernels` (None for the compiled CPU op): the reference plans its own.
        return reference.paged_decode_attention(q, self.k_cache, self.v_cache, meta.decode_block_tables,
                                                meta.decode_context_lens, self.scale, None,
                                                sliding_window=self.sliding_window, softcap=self.softcap)
