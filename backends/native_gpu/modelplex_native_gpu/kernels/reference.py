"""Torch reference implementations of the paged-attention kernels; also the CPU execution path.

Cache shape: k_cache / v_cache are [num_blocks, block_size, num_kv_heads, head_dim], either contiguous
or (the fast CPU layout) a permuted view of a head-major [num_kv_heads, num_blocks, block_size, head_dim]
tensor: then gathering a sequence's blocks yields [Hkv, N, D] matrices that attention reads without copies.
Block tables are padded with block 0 (the null block); padded positions are masked out.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def store_kvcache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, Hkv, D] into the cache slots slot_mapping [T]; slot -1 means skip (padding)."""
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    k_cache.flatten(0, 1).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_cache.flatten(0, 1).index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def _gather(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """Block ids [B, num_blocks] -> keys or values [B, Hkv, num_blocks * block_size, D]."""
    head_major = cache.permute(2, 0, 1, 3)  # [Hkv, num_blocks, block_size, D]; a free view in the CPU layout
    rows = head_major.index_select(1, block_table.reshape(-1))
    num_kv_heads, head_dim = cache.shape[2], cache.shape[3]
    return rows.view(num_kv_heads, block_table.shape[0], -1, head_dim).transpose(0, 1)


_DECODE_GROUP = 16  # sequences per gather: bounds padding to the longest context of a group


def paged_decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One query token per sequence. query [B, H, D]; block_tables [B, max_blocks]; context_lens [B].

    Returns [B, H, D]. Query head h reads KV head h // (H // Hkv), as in HF's repeat_kv.
    Sequences are taken in groups of similar length so short ones do not gather the longest's blocks.
    """
    batch = query.shape[0]
    if batch <= _DECODE_GROUP:
        return _decode_group(query, k_cache, v_cache, block_tables, context_lens, scale)
    out = torch.empty_like(query)
    order = torch.argsort(context_lens)
    block_size = k_cache.shape[1]
    for start in range(0, batch, _DECODE_GROUP):
        idx = order[start:start + _DECODE_GROUP]
        lens = context_lens[idx]
        num_blocks = (int(lens.max()) + block_size - 1) // block_size
        out[idx] = _decode_group(query[idx], k_cache, v_cache, block_tables[idx, :num_blocks], lens, scale)
    return out


def _decode_group(query, k_cache, v_cache, block_tables, context_lens, scale):
    batch, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    keys = _gather(k_cache, block_tables)  # [B, Hkv, N, D]
    values = _gather(v_cache, block_tables)
    positions = torch.arange(keys.shape[2], device=query.device)
    mask = (positions[None, :] < context_lens[:, None])[:, None, None, :]  # [B, 1, 1, N]
    q = query.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=scale)
    return out.reshape(batch, num_heads, head_dim)


def prefix_prefill_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor,
                             scale: float, max_query_len: int | None = None) -> torch.Tensor:
    """Causal attention for query chunks whose K/V (cached prefix + the chunk) are already in the cache.

    query [T, H, D] holds sequence s at rows cu_seqlens_q[s]:cu_seqlens_q[s+1]; context_lens[s] is the
    sequence's KV length including the chunk, so its query j sits at position context_lens[s] - q_len + j.
    `max_query_len` only sizes the Triton launch grid (saves a device sync); unused here.
    """
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty_like(query)
    starts, lens = cu_seqlens_q.tolist(), context_lens.tolist()
    for s, ctx_len in enumerate(lens):
        q_start, q_end = starts[s], starts[s + 1]
        q_len = q_end - q_start
        table = block_tables[s, :(ctx_len + block_size - 1) // block_size]
        keys = _gather(k_cache, table[None])[0, :, :ctx_len].to(query.dtype)  # [Hkv, N, D]
        values = _gather(v_cache, table[None])[0, :, :ctx_len].to(query.dtype)
        q = query[q_start:q_end].transpose(0, 1)  # [H, q_len, D]
        if q_len == ctx_len:
            mask, is_causal = None, True
        else:
            q_pos = torch.arange(ctx_len - q_len, ctx_len, device=query.device)
            mask, is_causal = torch.arange(ctx_len, device=query.device)[None, :] <= q_pos[:, None], False
        # 4-D inputs: torch's CPU flash kernel handles them; 3-D ones fall back to the slow math path.
        o = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, is_causal=is_causal,
                                           scale=scale, enable_gqa=num_kv_heads != num_heads)
        out[q_start:q_end] = o[0].transpose(0, 1)
    return out
