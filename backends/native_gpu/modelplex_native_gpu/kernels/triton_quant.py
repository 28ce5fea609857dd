"""Triton matmul on GGUF-quantized weights (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K) for CUDA.

y = x @ W^T (+ bias): each program owns a [BLOCK_M, BLOCK_N] output tile and walks K in BLOCK_K steps,
dequantizing the [BLOCK_K, BLOCK_N] weight tile in registers (fp32, the same operations as
gguf.quants.dequantize) and multiplying it with `tl.dot` in the activation dtype (bf16/fp16 on tensor
cores; fp32 in full precision, not tf32), accumulating in fp32; the output is in x's dtype. The weights
are the planes of kernels/quant_layout.py (split once at load: aligned fp16 scales, quant bytes
contiguous along a row) and never exist dequantized in memory. Any M, N and K (K a multiple of the
type's block, as every GGUF row is) are masked. Decode batches on a GPU also split K across programs
(`_num_splits`), their fp32 partials summed in a fixed order by a second kernel (deterministic).
The torch reference is quant_layout.quant_matmul. Tested compiled on a GPU and, without one, under
TRITON_INTERPRET=1 on CPU tensors (hence no multi-config autotuning: the tile sizes come from `_tiles`).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .quant_layout import QuantPlanes

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # read when kernels are decorated, as triton does


@triton.jit
def _dequantize_tile(qs_ptr, qh_ptr, d_ptr, dmin_ptr, sc_ptr, mn_ptr, n, k, mask, K, QTYPE: tl.constexpr):
    """fp32 weights W[n, k] for n [1, BLOCK_N], k [BLOCK_K, 1] (int32) -> [BLOCK_K, BLOCK_N]: the bytes
    and bits quant_layout.dequantize reads for each weight."""
    if QTYPE == 8:  # Q8_0
        q = tl.load(qs_ptr + n * K + k, mask=mask, other=0).to(tl.float32)
        w = q * tl.load(d_ptr + n * (K // 32) + k // 32, mask=mask, other=0).to(tl.float32)
    elif QTYPE < 12:  # Q4_0 (2), Q4_1 (3), Q5_0 (6): 32-weight blocks, nibbles j and j + 16
        j = k % 32
        byte = tl.load(qs_ptr + n * (K // 2) + k // 32 * 16 + j % 16, mask=mask, other=0).to(tl.int32)
        q = (byte >> (j // 16 * 4)) & 15
        d = tl.load(d_ptr + n * (K // 32) + k // 32, mask=mask, other=0).to(tl.float32)
        if QTYPE == 2:
            w = (q - 8).to(tl.float32) * d
        elif QTYPE == 3:
            w = q.to(tl.float32) * d + tl.load(dmin_ptr + n * (K // 32) + k // 32, mask=mask, other=0).to(tl.float32)
        else:
            h = (tl.load(qh_ptr + n * (K // 8) + k // 8, mask=mask, other=0).to(tl.int32) >> (k % 8)) & 1
            w = ((q | (h << 4)) - 16).to(tl.float32) * d
    elif QTYPE == 14:  # Q6_K: 256-weight super-blocks, 16-weight sub-block scales
        j = k % 256
        r = j % 128
        lo = tl.load(qs_ptr + n * (K // 2) + k // 256 * 128 + j // 128 * 64 + r % 64, mask=mask, other=0)
        hi = tl.load(qh_ptr + n * (K // 4) + k // 256 * 64 + j // 128 * 32 + r % 32, mask=mask, other=0)
        lo = (lo.to(tl.int32) >> (r // 64 * 4)) & 15
        hi = (hi.to(tl.int32) >> (r // 32 * 2)) & 3
        d = tl.load(d_ptr + n * (K // 256) + k // 256, mask=mask, other=0).to(tl.float32)
        sc = tl.load(sc_ptr + n * (K // 16) + k // 16, mask=mask, other=0).to(tl.float32)
        w = (d * sc) * ((lo | (hi << 4)) - 32).to(tl.float32)
    else:  # Q4_K, Q5_K: 256-weight super-blocks, 32-weight sub-blocks with a scale and a min each
        j = k % 256
        byte = tl.load(qs_ptr + n * (K // 2) + k // 256 * 128 + j // 64 * 32 + j % 32, mask=mask, other=0)
        q = (byte.to(tl.int32) >> (j % 64 // 32 * 4)) & 15
        if QTYPE == 13:
            h = tl.load(qh_ptr + n * (K // 8) + k // 256 * 32 + j % 32, mask=mask, other=0).to(tl.int32)
            q = q | (((h >> (j // 32)) & 1) << 4)
        sub = n * (K // 32) + k // 32
        d = tl.load(d_ptr + n * (K // 256) + k // 256, mask=mask, other=0).to(tl.float32)
        dmin = tl.load(dmin_ptr + n * (K // 256) + k // 256, mask=mask, other=0).to(tl.float32)
        sc = tl.load(sc_ptr + sub, mask=mask, other=0).to(tl.float32)
        mn = tl.load(mn_ptr + sub, mask=mask, other=0).to(tl.float32)
        w = (d * sc) * q.to(tl.float32) - dmin * mn
    return w


@triton.jit
def _round_to_bf16(v):
    """fp32 -> the nearest bf16 value (ties to even), still fp32: the interpreter's own cast truncates."""
    bits = v.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _quant_matmul_kernel(x_ptr, qs_ptr, qh_ptr, d_ptr, dmin_ptr, sc_ptr, mn_ptr, bias_ptr, out_ptr, partial_ptr,
                         M, N, K, stride_xm, stride_om, k_per_split, QTYPE: tl.constexpr, HAS_BIAS: tl.constexpr,
                         DOT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    """Program (m, n, s) sums K range s; with SPLIT > 1 its fp32 partial goes to partial[s], else (bias added,
    in x's dtype) to out."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_per_split
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0)
        w = _dequantize_tile(qs_ptr, qh_ptr, d_ptr, dmin_ptr, sc_ptr, mn_ptr, offs_n[None, :], offs_k[:, None],
                             mask_k[:, None] & mask_n[None, :], K, QTYPE)
        if DOT == 0:  # fp32: tl.dot rounds fp32 inputs to tf32 by default
            acc += tl.dot(x, w, input_precision="ieee")
        elif DOT == 1:
            acc += tl.dot(x, w.to(x.dtype))
        else:  # the same bf16 products (exact in fp32), for the interpreter: see _dot_mode
            acc += tl.dot(x.to(tl.float32), _round_to_bf16(w), input_precision="ieee")
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT > 1:
        tl.store(partial_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        if DOT == 2:
            acc = _round_to_bf16(acc)
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sum_splits_kernel(partial_ptr, bias_ptr, out_ptr, M, N, stride_om, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                       DOT: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[m] = sum of partial[s, m] over s in order (deterministic, unlike atomic adds) + bias."""
    pid_m = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(partial_ptr + s * M * N + pid_m * N + offs_n, mask=mask_n, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    if DOT == 2:
        acc = _round_to_bf16(acc)
    tl.store(out_ptr + pid_m * stride_om + offs_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)


def _dot_mode(dtype: torch.dtype) -> int:
    """0: fp32 in full precision; 1: tl.dot in the activation dtype; 2: bf16 operands multiplied as fp32, for
    the interpreter only: triton 3.9's interpreter multiplies bf16 tiles as their raw uint16 bits, and its
    fp32 -> bf16 casts truncate (the GPU rounds to nearest even, as `_round_to_bf16` does)."""
    if dtype == torch.float32:
        return 0
    return 2 if dtype == torch.bfloat16 and _INTERPRETED else 1


def _tiles(m: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps): 16 rows (tl.dot's smallest tile) and narrow column tiles for
    decode batches (more programs over a small N), square tiles for prefill. Chosen so that ptxas (sm_90a)
    spills no registers for any type at bf16 (the 128-row tile: 16 bytes, Q6_K); not timed yet.
    Interpreted, fewer larger tiles cost less (the interpreter's cost is per program)."""
    if _INTERPRETED:
        return 16 if m <= 16 else 64, 64, 64, 4
    if m <= 16:
        return 16, 32, 128, 8
    if m <= 64:
        return 64, 64, 64, 8
    return 128, 128, 32, 8


def _sm_count(device: torch.device) -> int:
    if device not in _SM_COUNTS:
        _SM_COUNTS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNTS[device]


_SM_COUNTS: dict[torch.device, int] = {}


def _num_splits(m: int, n: int, k: int, block_n: int, block_k: int, device: torch.device) -> int:
    """K splits for decode batches: a 16-row tile over a few thousand columns is a few dozen programs on a
    GPU of ~100+ SMs (and decode reads weights: it needs many loads in flight), so K is cut until there
    are ~2 programs an SM, at most 8 splits. Prefill tiles have programs enough."""
    if m > 16 or device.type != "cuda":
        return 1
    return max(1, min(triton.cdiv(k, block_k), 8, triton.cdiv(2 * _sm_count(device), triton.cdiv(n, block_n))))


def quant_matmul(x: torch.Tensor, planes: QuantPlanes, bias: torch.Tensor | None = None,
                 out: torch.Tensor | None = None, num_splits: int | None = None) -> torch.Tensor:
    """x [M, K] (bf16, fp16 or fp32; rows may be strided, the last dim contiguous) @ W^T (+ bias) -> [M, N]
    in x's dtype, written into `out` (a possibly strided [M, N] view, e.g. a column slice) when given.
    `num_splits` cuts K into that many ranges summed in a second pass (None: `_num_splits` decides)."""
    m, k = x.shape
    assert k == planes.in_features and x.stride(1) == 1, (x.shape, planes.in_features)
    n = planes.rows
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.stride(1) == 1 and out.dtype == x.dtype
    # offsets are int32 (int64 address arithmetic on every weight of a tile cost registers and spills)
    assert max(n * k, m * x.stride(0), m * out.stride(0), 8 * m * n) < 2 ** 31, (m, n, k)
    if m == 0:
        return out
    block_m, block_n, block_k, num_warps = _tiles(m)
    k_tiles = triton.cdiv(k, block_k)
    splits = num_splits or _num_splits(m, n, k, block_n, block_k, x.device)
    tiles_per_split = triton.cdiv(k_tiles, min(splits, k_tiles))
    splits = triton.cdiv(k_tiles, tiles_per_split)  # none empty
    partial = torch.empty(splits, m, n, dtype=torch.float32, device=x.device) if splits > 1 else out
    p = planes
    qh, dmin, sc, mn = (t if t is not None else p.qs for t in (p.qh, p.dmin, p.sc, p.mn))  # unused: any pointer
    bias_arg = bias if bias is not None else out
    dot = _dot_mode(x.dtype)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), splits)
    _quant_matmul_kernel[grid](
        x, p.qs, qh, p.d, dmin, sc, mn, bias_arg, out, partial, m, n, k, x.stride(0), out.stride(0),
        tiles_per_split * block_k, QTYPE=p.qtype, HAS_BIAS=bias is not None, DOT=dot, SPLIT=splits,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps)
    if splits > 1:
        _sum_splits_kernel[(m, triton.cdiv(n, 256))](partial, bias_arg, out, m, n, out.stride(0), SPLIT=splits,
                                                     HAS_BIAS=bias is not None, DOT=dot, BLOCK_N=256)
    return out
