"""Torch reference implementations of the paged-attention kernels; also the CPU execution path.

Cache shape: k_cache / v_cache are [num_blocks, block_size, num_kv_heads, head_dim], either contiguous
or (the fast CPU layout) a permuted view of a head-major [num_kv_heads, num_blocks, block_size, head_dim]
tensor: then gathering a sequence's blocks yields [Hkv, N, D] matrices that attention reads without copies.
Block tables are padded with block 0 (the null block); padded positions are masked out.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def store_kvcache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, Hkv, D] into the cache slots slot_mapping [T]; slot -1 means skip (padding)."""
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    for src, cache in ((key, k_cache), (value, v_cache)):
        head_major = cache.permute(2, 0, 1, 3)
        if head_major.is_contiguous():  # write rows of a contiguous [Hkv, slots, D]: no strided scatter
            head_major.view(head_major.shape[0], -1, head_major.shape[3]).index_copy_(
                1, slot_mapping, src.transpose(0, 1).to(cache.dtype))
        else:
            cache.flatten(0, 1).index_copy_(0, slot_mapping, src.to(cache.dtype))


def _gather(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """Block ids [B, num_blocks] -> keys or values [B, Hkv, num_blocks * block_size, D]."""
    head_major = cache.permute(2, 0, 1, 3)  # [Hkv, num_blocks, block_size, D]; a free view in the CPU layout
    rows = head_major.index_select(1, block_table.reshape(-1))
    num_kv_heads, head_dim = cache.shape[2], cache.shape[3]
    return rows.view(num_kv_heads, block_table.shape[0], -1, head_dim).transpose(0, 1)


@dataclass
class DecodeGroup:
    """Sequences start:end of a decode batch, attended with one gather padded to kv_len tokens."""

    start: int
    end: int
    block_tables: torch.Tensor  # [end - start, ceil(kv_len / block_size)]
    kv_len: int
    mask: torch.Tensor | None  # [end - start, 1, 1, kv_len]; None when every sequence has kv_len tokens


_MAX_PADDING = 0.25  # a group grows while its padded tokens stay within this share of its real tokens


def plan_decode(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> list[DecodeGroup]:
    """Cut a decode batch into runs of similar length (built once per step, shared by all layers).

    Runs are contiguous, so a batch sorted by length (as the CPU runner orders it) pads little.
    """
    lens = context_lens.tolist()
    groups, start = [], 0
    while start < len(lens):
        end, longest, total = start + 1, lens[start], lens[start]
        while end < len(lens):
            new_longest = max(longest, lens[end])
            if new_longest * (end + 1 - start) > (1 + _MAX_PADDING) * (total + lens[end]):
                break
            longest, total, end = new_longest, total + lens[end], end + 1
        mask = None
        if any(n != longest for n in lens[start:end]):
            positions = torch.arange(longest, device=context_lens.device)
            mask = (positions[None, :] < context_lens[start:end, None])[:, None, None, :]
        groups.append(DecodeGroup(start, end, block_tables[start:end, :-(-longest // block_size)], longest, mask))
        start = end
    return groups


def paged_decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           plan: list[DecodeGroup] | None = None, sliding_window: int | None = None,
                           softcap: float | None = None) -> torch.Tensor:
    """One query token per sequence. query [B, H, D]; block_tables [B, max_blocks]; context_lens [B].

    Returns [B, H, D]. Query head h reads KV head h // (H // Hkv), as in HF's repeat_kv: the query heads
    sharing a KV head are the "query length" of one SDPA call, so K/V are never repeated.
    `plan` (from plan_decode) is reused across layers; it is built here when absent. With `sliding_window`
    the query (at position context_len - 1) reads only the last `sliding_window` positions: blocks before
    them may be the null block (freed). `softcap`: scores become tanh(score / softcap) * softcap.
    """
    if plan is None:
        plan = plan_decode(block_tables, context_lens, k_cache.shape[1])
    batch, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    q = query.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    outs = []
    for g in plan:
        keys = _gather(k_cache, g.block_tables)[:, :, :g.kv_len]  # [b, Hkv, N, D]
        values = _gather(v_cache, g.block_tables)[:, :, :g.kv_len]
        mask = g.mask
        if sliding_window is not None:
            positions = torch.arange(g.kv_len, device=query.device)
            lens = context_lens[g.start:g.end, None]
            mask = ((positions[None, :] < lens) & (positions[None, :] >= lens - sliding_window))[:, None, None, :]
        outs.append(_attend(q[g.start:g.end], keys.to(q.dtype), values.to(q.dtype), mask, scale, softcap))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out.reshape(batch, num_heads, head_dim)


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float,
            softcap: float | None) -> torch.Tensor:
    """Attention of q [..., L, D] over keys/values [..., N, D] (broadcast over leading dims, e.g. the query
    heads of one KV head); with `softcap`, HF's eager order: scale, cap, mask, fp32 softmax."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    scores = torch.tanh(torch.matmul(q, keys.transpose(-1, -2)) * scale / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), values)


def prefix_prefill_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor,
                             scale: float, max_query_len: int | None = None, key: torch.Tensor | None = None,
                             value: torch.Tensor | None = None, sliding_window: int | None = None,
                             softcap: float | None = None) -> torch.Tensor:
    """Causal attention for query chunks whose K/V (cached prefix + the chunk) are already in the cache.

    query [T, H, D] holds sequence s at rows cu_seqlens_q[s]:cu_seqlens_q[s+1]; context_lens[s] is the
    sequence's KV length including the chunk, so its query j sits at position context_lens[s] - q_len + j.
    `key`/`value` [T, Hkv, D], when given, are the chunks' own K/V: a chunk with no cached prefix attends
    to them directly instead of gathering its blocks back. `max_query_len` only sizes the Triton launch
    grid (saves a device sync); unused here. `sliding_window` and `softcap` as in paged_decode_attention;
    with a window only the blocks the chunk can see are gathered.
    """
    block_size = k_cache.shape[1]
    out = torch.empty_like(query)
    starts, lens = cu_seqlens_q.tolist(), context_lens.tolist()
    for s, ctx_len in enumerate(lens):
        q_start, q_end = starts[s], starts[s + 1]
        q_len = q_end - q_start
        first = 0  # first key position gathered: a block boundary
        if sliding_window is not None:
            first = max(0, ctx_len - q_len - sliding_window + 1) // block_size * block_size
        if q_len == ctx_len and key is not None:
            keys, values = key[q_start:q_end].transpose(0, 1), value[q_start:q_end].transpose(0, 1)
        else:
            table = block_tables[s, first // block_size:(ctx_len + block_size - 1) // block_size]
            keys = _gather(k_cache, table[None])[0, :, :ctx_len - first].to(query.dtype)  # [Hkv, N, D]
            values = _gather(v_cache, table[None])[0, :, :ctx_len - first].to(query.dtype)
        out[q_start:q_end] = _prefill_one(query[q_start:q_end], keys, values, ctx_len, first, scale,
                                          sliding_window, softcap)
    return out


def _prefill_one(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, ctx_len: int, first: int,
                 scale: float, sliding_window: int | None, softcap: float | None) -> torch.Tensor:
    """One sequence's chunk: query [q_len, H, D] at the last q_len of ctx_len positions; keys/values
    [Hkv, ctx_len - first, D] from position `first`. -> [q_len, H, D]."""
    q_len, num_heads, head_dim = query.shape
    num_kv_heads = keys.shape[0]
    q = query.transpose(0, 1)  # [H, q_len, D]
    mask, is_causal = None, q_len == ctx_len and sliding_window is None and softcap is None
    if not is_causal:
        q_pos = torch.arange(ctx_len - q_len, ctx_len, device=query.device)[:, None]
        k_pos = torch.arange(first, ctx_len, device=query.device)[None, :]
        mask = k_pos <= q_pos
        if sliding_window is not None:
            mask &= k_pos > q_pos - sliding_window
    if softcap is not None:
        grouped = q.reshape(num_kv_heads, num_heads // num_kv_heads, q_len, head_dim)
        out = _attend(grouped, keys[:, None], values[:, None], mask, scale, softcap)  # [Hkv, G, q_len, D]
        return out.reshape(num_heads, q_len, head_dim).transpose(0, 1)
    # 4-D inputs: torch's CPU flash kernel handles them; 3-D ones fall back to the slow math path.
    o = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, is_causal=is_causal,
                                       scale=scale, enable_gqa=num_kv_heads != num_heads)
    return o[0].transpose(0, 1)
