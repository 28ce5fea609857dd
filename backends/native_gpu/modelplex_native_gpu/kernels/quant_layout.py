"""GGUF quantized blocks split into planes for the Triton matmul (kernels/triton_quant.py), and its torch
reference: dequantization by the same index arithmetic the kernel uses.

A ggml block packs its fp16 scale(s) and its quants in one record of 18-210 bytes, so on a GPU the scales
sit at unaligned addresses (Triton has no unaligned fp16 load) and a tile's quants are strided by the
record size. `split_planes` runs once at load and regroups each row's bytes by field: every plane is a
contiguous [rows, ...] tensor, the quant bytes keep ggml's order within a block (the kernel addresses a
weight's nibble or bit directly), and the K-quants' 12 bytes of packed 6-bit scales and mins are
unpacked to one byte each (+4 bytes a 256-weight super-block: 148 instead of 144). Every weight's bits
are kept; `dequantize` equals gguf.quants.dequantize bit for bit (same fp32 operations in the same order).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# ggml's type number -> (weights a block, bytes a block); the layouts below are ggml's (ggml-common.h)
BLOCKS = {8: (32, 34), 2: (32, 18), 3: (32, 20), 6: (32, 22), 12: (256, 144), 13: (256, 176), 14: (256, 210)}
Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K = 8, 2, 3, 6, 12, 13, 14


@dataclass
class QuantPlanes:
    """One GGUF type's [rows, in_features] weight, plane by plane (all contiguous, on one device):
    qs    Q8_0: int8 [rows, K]; the others: uint8 [rows, K/2] (Q6_K: its low 4 bits, `ql`)
    qh    uint8 high bits: Q5_0 / Q5_K [rows, K/8], Q6_K [rows, K/4]; else None
    d     fp16 scale a block: [rows, K/32], K-quants [rows, K/256]
    dmin  fp16: Q4_1's min a block [rows, K/32], Q4_K/Q5_K's super-block min [rows, K/256]; else None
    sc    K-quants' sub-block scales: Q4_K/Q5_K uint8 [rows, K/32], Q6_K int8 [rows, K/16]; else None
    mn    Q4_K/Q5_K's sub-block mins, uint8 [rows, K/32]; else None
    """

    qtype: int
    in_features: int
    qs: torch.Tensor
    d: torch.Tensor
    qh: torch.Tensor | None = None
    dmin: torch.Tensor | None = None
    sc: torch.Tensor | None = None
    mn: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return self.qs.shape[0]

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.qs, self.qh, self.d, self.dmin, self.sc, self.mn) if t is not None]

    def map(self, fn) -> QuantPlanes:
        """The same planes with `fn` applied to each (a device move, a row selection)."""
        return QuantPlanes(self.qtype, self.in_features,
                           *(None if t is None else fn(t) for t in (self.qs, self.d, self.qh, self.dmin, self.sc,
                                                                      self.mn)))


def _fp16(fields: torch.Tensor) -> torch.Tensor:
    """[rows, blocks, 2] bytes -> fp16 [rows, blocks]."""
    return fields.contiguous().view(torch.float16).squeeze(-1)


def _flat(fields: torch.Tensor) -> torch.Tensor:
    return fields.reshape(fields.shape[0], -1).contiguous()


def _k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes a super-block -> 8 six-bit scales and 8 mins (ggml's get_scale_min_k4)."""
    lo, hi, mixed = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([lo & 63, (mixed & 15) | ((lo >> 6) << 4)], dim=-1)
    mn = torch.cat([hi & 63, (mixed >> 4) | ((hi >> 6) << 4)], dim=-1)
    return _flat(sc), _flat(mn)


def split_planes(data: torch.Tensor, qtype: int, in_features: int) -> QuantPlanes:
    """uint8 [rows, row bytes] in ggml's blocks (as layers/quantized.py holds them) -> planes, on data's device."""
    block, nbytes = BLOCKS[qtype]
    b = data.reshape(data.shape[0], in_features // block, nbytes)
    if qtype == Q8_0:
        return QuantPlanes(qtype, in_features, _flat(b[..., 2:]).view(torch.int8), _fp16(b[..., 0:2]))
    if qtype == Q4_0:
        return QuantPlanes(qtype, in_features, _flat(b[..., 2:]), _fp16(b[..., 0:2]))
    if qtype == Q4_1:
        return QuantPlanes(qtype, in_features, _flat(b[..., 4:]), _fp16(b[..., 0:2]), dmin=_fp16(b[..., 2:4]))
    if qtype == Q5_0:
        return QuantPlanes(qtype, in_features, _flat(b[..., 6:]), _fp16(b[..., 0:2]), qh=_flat(b[..., 2:6]))
    if qtype in (Q4_K, Q5_K):
        sc, mn = _k_scales(b[..., 4:16])
        qh = _flat(b[..., 16:48]) if qtype == Q5_K else None
        qs = _flat(b[..., 48:] if qtype == Q5_K else b[..., 16:])
        return QuantPlanes(qtype, in_features, qs, _fp16(b[..., 0:2]), qh=qh, dmin=_fp16(b[..., 2:4]), sc=sc, mn=mn)
    if qtype == Q6_K:
        return QuantPlanes(qtype, in_features, _flat(b[..., 0:128]), _fp16(b[..., 208:210]), qh=_flat(b[..., 128:192]),
                           sc=_flat(b[..., 192:208]).view(torch.int8))
    raise ValueError(f"GGML type {qtype} has no plane layout")


def _at(plane: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """plane[:, index] as int32 (index: one position a weight)."""
    return plane[:, index].to(torch.int32)


def dequantize(p: QuantPlanes) -> torch.Tensor:
    """fp32 [rows, in_features]; weight k of a row reads the bytes and bits triton_quant._dequantize_tile reads."""
    k = torch.arange(p.in_features, device=p.qs.device)
    if p.qtype == Q8_0:
        return _at(p.qs, k).float() * p.d[:, k // 32].float()
    if p.qtype in (Q4_0, Q4_1, Q5_0):
        j = k % 32
        q = (_at(p.qs, k // 32 * 16 + j % 16) >> (j // 16 * 4)) & 15
        d = p.d[:, k // 32].float()
        if p.qtype == Q4_0:
            return (q - 8).float() * d
        if p.qtype == Q4_1:
            return q.float() * d + p.dmin[:, k // 32].float()
        h = (_at(p.qh, k // 8) >> (k % 8)) & 1
        return ((q | (h << 4)) - 16).float() * d
    j = k % 256
    if p.qtype == Q6_K:
        r = j % 128
        lo = (_at(p.qs, k // 256 * 128 + j // 128 * 64 + r % 64) >> (r // 64 * 4)) & 15
        hi = (_at(p.qh, k // 256 * 64 + j // 128 * 32 + r % 32) >> (r // 32 * 2)) & 3
        return (p.d[:, k // 256].float() * p.sc[:, k // 16].float()) * ((lo | (hi << 4)) - 32).float()
    q = (_at(p.qs, k // 256 * 128 + j // 64 * 32 + j % 32) >> (j % 64 // 32 * 4)) & 15
    if p.qtype == Q5_K:
        q = q | (((_at(p.qh, k // 256 * 32 + j % 32) >> (j // 32)) & 1) << 4)
    scale = p.d[:, k // 256].float() * p.sc[:, k // 32].float()
    return scale * q.float() - p.dmin[:, k // 256].float() * p.mn[:, k // 32].float()


def quant_matmul(x: torch.Tensor, planes: QuantPlanes, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton kernel's reference: x [M, K] @ W^T (+ bias) -> [M, N] in x's dtype, accumulated in fp32."""
    y = x.float() @ dequantize(planes).T
    if bias is not None:
        y += bias.float()
    return y.to(x.dtype)
