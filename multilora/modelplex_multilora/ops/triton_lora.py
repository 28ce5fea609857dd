"""Triton kernels for CUDA: BGMV-style LoRA shrink and expand, each token reading only its own slot.

Same signatures as ops/reference.py. Tested compiled on a GPU and, without one, under TRITON_INTERPRET=1
on CPU tensors (one config, no autotune).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..mapping import LoRAMapping


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, slots_ptr, out_ptr, x_stride_t, a_stride_s, a_stride_n, a_stride_r,
                   out_stride_t, out_stride_n, IN_FEATURES: tl.constexpr, RANK: tl.constexpr,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    token, piece = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots_ptr + token)
    offs_r = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    if slot >= 0:
        a_rows = a_ptr + slot.to(tl.int64) * a_stride_s + piece * a_stride_n + offs_r[:, None] * a_stride_r
        for start in range(0, IN_FEATURES, BLOCK_K):
            offs_k = start + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + token * x_stride_t + offs_k, mask=offs_k < IN_FEATURES, other=0.0)
            a = tl.load(a_rows + offs_k[None, :], mask=(offs_r[:, None] < RANK) & (offs_k[None, :] < IN_FEATURES),
                        other=0.0)
            acc += tl.sum(a.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    tl.store(out_ptr + token * out_stride_t + piece * out_stride_n + offs_r, acc.to(out_ptr.dtype.element_ty),
             mask=offs_r < RANK)


@triton.jit
def _expand_kernel(s_ptr, b_ptr, slots_ptr, y_ptr, s_stride_t, b_stride_s, b_stride_r, y_stride_t, y_offset,
                   OUT_FEATURES: tl.constexpr, RANK: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    token, block = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots_ptr + token)
    if slot >= 0:
        offs_r = tl.arange(0, BLOCK_R)
        offs_n = block * BLOCK_N + tl.arange(0, BLOCK_N)
        s = tl.load(s_ptr + token * s_stride_t + offs_r, mask=offs_r < RANK, other=0.0)
        b = tl.load(b_ptr + slot.to(tl.int64) * b_stride_s + offs_r[:, None] * b_stride_r + offs_n[None, :],
                    mask=(offs_r[:, None] < RANK) & (offs_n[None, :] < OUT_FEATURES), other=0.0)
        delta = tl.sum(s.to(tl.float32)[:, None] * b.to(tl.float32), axis=0)
        y_cols = y_ptr + token * y_stride_t + y_offset + offs_n
        y = tl.load(y_cols, mask=offs_n < OUT_FEATURES)
        tl.store(y_cols, (y.to(tl.float32) + delta).to(y_ptr.dtype.element_ty), mask=offs_n < OUT_FEATURES)


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
    num_tokens, in_features = x.shape
    _, n, rank, _ = lora_a.shape
    assert x.stride(1) == 1 and lora_a.stride(3) == 1
    out = torch.empty(num_tokens, n, rank, dtype=x.dtype, device=x.device)
    _shrink_kernel[(num_tokens, n)](
        x, lora_a, mapping.token_slots, out, x.stride(0), lora_a.stride(0), lora_a.stride(1), lora_a.stride(2),
        out.stride(0), out.stride(1), IN_FEATURES=in_features, RANK=rank,
        BLOCK_R=triton.next_power_of_2(rank), BLOCK_K=min(128, triton.next_power_of_2(in_features)))
    return out


def lora_expand(y: torch.Tensor, s: torch.Tensor, lora_b: tuple[torch.Tensor, ...], mapping: LoRAMapping) -> None:
    num_tokens, _, rank = s.shape
    assert y.stride(1) == 1 and s.stride(2) == 1
    offset = 0
    for i, b in enumerate(lora_b):
        out_features = b.shape[-1]
        assert b.stride(2) == 1
        block_n = min(128, triton.next_power_of_2(out_features))
        piece = s[:, i]
        _expand_kernel[(num_tokens, triton.cdiv(out_features, block_n))](
            piece, b, mapping.token_slots, y, piece.stride(0), b.stride(0), b.stride(1), y.stride(0), offset,
            OUT_FEATURES=out_features, RANK=rank, BLOCK_R=triton.next_power_of_2(rank), BLOCK_N=block_n)
        offset += out_features
