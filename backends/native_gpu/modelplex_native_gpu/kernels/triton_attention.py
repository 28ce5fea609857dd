"""Triton kernels for CUDA: KV-cache store, paged decode attention, prefill attention over a cached prefix.

Same signatures as kernels/reference.py; caches may be any strided view of
[num_blocks, block_size, num_kv_heads, head_dim] with a contiguous last dim. Block size must be a power of two
>= 16 (tl.dot tiles);
any head size works (padded to the next power of two and masked). fp32 inputs are multiplied in
full fp32 (not tf32), so the fp32 engine stays token-exact against transformers on a GPU.
Tested compiled on a GPU and, without one, under TRITON_INTERPRET=1 on CPU tensors (hence no
multi-config autotuning).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kvcache_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                          key_stride_t, key_stride_h, value_stride_t, value_stride_h,
                          cache_stride_b, cache_stride_t, cache_stride_h,
                          NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                          BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:  # a padded token owns no slot
        return
    offs_h = tl.arange(0, BLOCK_H)[:, None]
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    mask = (offs_h < NUM_KV_HEADS) & (offs_d < HEAD_DIM)
    k = tl.load(key_ptr + token * key_stride_t + offs_h * key_stride_h + offs_d, mask=mask)
    v = tl.load(value_ptr + token * value_stride_t + offs_h * value_stride_h + offs_d, mask=mask)
    dst = ((slot // BLOCK_SIZE) * cache_stride_b + (slot % BLOCK_SIZE) * cache_stride_t + offs_h * cache_stride_h
           + offs_d)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kvcache(key, value, k_cache, v_cache, slot_mapping) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    assert key.stride(-1) == value.stride(-1) == k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride()
    _store_kvcache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping, key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=k_cache.shape[1])


@triton.jit
def _paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr,
                         scale, q_stride_b, q_stride_h, bt_stride, out_stride_b, out_stride_h,
                         cache_stride_b, cache_stride_t, cache_stride_h, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    offs_t = tl.arange(0, BLOCK_SIZE)
    q = tl.load(q_ptr + seq * q_stride_b + head * q_stride_h + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    ctx_len = tl.load(context_lens_ptr + seq)
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for blk in range(0, tl.cdiv(ctx_len, BLOCK_SIZE)):
        block_id = tl.load(block_tables_ptr + seq * bt_stride + blk).to(tl.int64)
        pos = blk * BLOCK_SIZE + offs_t
        valid = pos < ctx_len
        base = (block_id * cache_stride_b + kv_head * cache_stride_h
                + offs_t[:, None] * cache_stride_t + offs_d[None, :])
        kv_mask = valid[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + base, mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_cache_ptr + base, mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    out = acc / l_i
    tl.store(out_ptr + seq * out_stride_b + head * out_stride_h + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=mask_d)


def plan_decode(block_tables, context_lens, block_size):
    """The kernel needs no per-step plan (the torch path groups sequences by length)."""
    return None


def paged_decode_attention(query, k_cache, v_cache, block_tables, context_lens, scale, plan=None):
    batch, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(query)
    _paged_decode_kernel[(batch, num_heads)](
        query, k_cache, v_cache, block_tables, context_lens, out, scale,
        query.stride(0), query.stride(1), block_tables.stride(0), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_SIZE=block_size)
    return out


@triton.jit
def _prefix_prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, cu_seqlens_q_ptr, context_lens_ptr,
                           out_ptr, scale, q_stride_t, q_stride_h, bt_stride, out_stride_t, out_stride_h,
                           cache_stride_b, cache_stride_t, cache_stride_h, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                           BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                           EXACT_FP32: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    ctx_len = tl.load(context_lens_ptr + seq)
    prefix_len = ctx_len - q_len
    kv_head = head // GROUP
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_t = tl.arange(0, BLOCK_SIZE)
    mask_m = offs_m < q_len
    mask_d = offs_d < HEAD_DIM
    q_rows = (q_start + offs_m)[:, None] * q_stride_t + head * q_stride_h + offs_d[None, :]
    q = tl.load(q_ptr + q_rows, mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    q_pos = prefix_len + offs_m
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Causality: this tile's last query sits at prefix_len + (tile + 1) * BLOCK_M - 1.
    kv_end = tl.minimum(ctx_len, prefix_len + (tile + 1) * BLOCK_M)
    for blk in range(0, tl.cdiv(kv_end, BLOCK_SIZE)):
        block_id = tl.load(block_tables_ptr + seq * bt_stride + blk).to(tl.int64)
        kv_pos = blk * BLOCK_SIZE + offs_t
        base = (block_id * cache_stride_b + kv_head * cache_stride_h
                + offs_t[:, None] * cache_stride_t + offs_d[None, :])
        kv_mask = (kv_pos < ctx_len)[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + base, mask=kv_mask, other=0.0).to(q.dtype)
        if EXACT_FP32:  # fp32 products in full precision: tl.dot rounds fp32 inputs to tf32 by default
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        else:
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
        allowed = (kv_pos[None, :] <= q_pos[:, None]) & (kv_pos[None, :] < ctx_len)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows of padding see no key at all
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        v = tl.load(v_cache_ptr + base, mask=kv_mask, other=0.0).to(q.dtype)
        if EXACT_FP32:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    out_rows = (q_start + offs_m)[:, None] * out_stride_t + head * out_stride_h + offs_d[None, :]
    tl.store(out_ptr + out_rows, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def prefix_prefill_attention(query, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                             max_query_len: int | None = None, key=None, value=None):
    """`key`/`value` (the chunks' own K/V) are unused: the kernel reads everything from the cache."""
    num_heads, head_dim = query.shape[1], query.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if max_query_len is None:  # pass it to avoid a device sync
        max_query_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    block_m = 16
    out = torch.empty_like(query)
    grid = (context_lens.shape[0], num_heads, triton.cdiv(max_query_len, block_m))
    _prefix_prefill_kernel[grid](
        query, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, scale,
        query.stride(0), query.stride(1), block_tables.stride(0), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_SIZE=block_size, BLOCK_M=block_m,
        EXACT_FP32=query.dtype == torch.float32)
    return out
