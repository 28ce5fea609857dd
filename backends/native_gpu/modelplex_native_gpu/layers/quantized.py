"""Weights kept in a GGUF file's quantized blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K) on the CPU.

A `QuantizedWeight` holds each output slice's rows as the file's bytes ([rows, row bytes] uint8, ggml's
blocks in k order); linear layers multiply with them in kernels/csrc/quant_linear.cpp and an embedding
table dequantizes only the rows a step looks up. Nothing here ever holds the weight in fp32. On the CPU,
`repack` rewrites the bytes in place, once at load, into the layout the compiled kernels multiply fastest
(Q4_0, Q4_1 and Q8_0 in 16-row groups: internal type numbers, kernels/csrc/quant_repack.cpp); the others stay.
The loader hands over lazy sources (anything with `qtype`, `shape` and `read_into(uint8 tensor)`), read
straight into their place: a fused q/k/v is written slice by slice, not concatenated from copies.
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from functools import cached_property

import torch

_HUGE_PAGE, _MADV_HUGEPAGE = 2 << 20, 14
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
# ggml's type number -> (weights a block, bytes a block)
QUANT_FORMATS = {8: (32, 34), 2: (32, 18), 3: (32, 20), 6: (32, 22), 12: (256, 144), 13: (256, 176), 14: (256, 210)}
QUANT_NAMES = {8: "Q8_0", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
# Q4_0, Q4_1 and Q8_0 repacked in 16-row groups (kernels/csrc/quant_repack.h): the same bytes a row as the file's
for _file_type, _repacked in ((2, 1002), (3, 1003), (8, 1008)):
    QUANT_FORMATS[_repacked], QUANT_NAMES[_repacked] = QUANT_FORMATS[_file_type], QUANT_NAMES[_file_type] + "x16"
GROUP16_TYPES = frozenset((1002, 1003, 1008))


def row_bytes(qtype: int, in_features: int) -> int:
    block, nbytes = QUANT_FORMATS[qtype]
    return in_features // block * nbytes


def is_quantized_source(tensor) -> bool:
    return hasattr(tensor, "read_into")


@dataclass
class QuantizedSegment:
    qtype: int
    data: torch.Tensor  # uint8 [rows, row bytes]


class QuantizedWeight:
    """An [out_features, in_features] weight as one or more row segments, each of one GGUF type (a fused
    q/k/v whose parts share a type is one segment; Q4_K_M files mix types, then each keeps its own)."""

    def __init__(self, segments: list[QuantizedSegment], in_features: int):
        self.segments = segments
        self.in_features = in_features
        self.out_features = sum(s.data.shape[0] for s in segments)

    @cached_property
    def ops(self):
        """The compiled CPU ops, looked up at the first multiply (then a plain attribute): a CUDA engine hands
        the blocks to layers/quantized_triton.py before that and never builds them."""
        from ..kernels import cpu

        ops = cpu.compiled_ops()
        if ops is None:
            raise RuntimeError("quantized weights need the compiled CPU ops")
        return ops

    @classmethod
    def read(cls, parts: list) -> QuantizedWeight:
        """Read lazy sources (rows stacked in order) into as few segments as their types allow."""
        in_features = parts[0].shape[1]
        segments: list[QuantizedSegment] = []
        i = 0
        while i < len(parts):
            j = i
            while j < len(parts) and parts[j].qtype == parts[i].qtype:
                j += 1
            rows = sum(p.shape[0] for p in parts[i:j])
            data = _huge_page_tensor(rows, row_bytes(parts[i].qtype, in_features))
            start = 0
            for p in parts[i:j]:
                p.read_into(data[start:start + p.shape[0]])
                start += p.shape[0]
            segments.append(QuantizedSegment(parts[i].qtype, data))
            i = j
        return cls(segments, in_features)

    def repack(self) -> None:
        """Rewrite each segment in place into the layout the compiled CPU kernels multiply fastest, where that
        differs from the file's (Q4_0, Q4_1, Q8_0 -> Q4_0x16, Q4_1x16, Q8_0x16 on AVX-512 VNNI). CPU only,
        once, after loading: anything holding this weight sees the new segments (a tied embedding looks rows
        up in them)."""
        for i, s in enumerate(self.segments):
            to_type = self.ops.quant_repacked_type(s.qtype)
            if to_type != s.qtype:
                self.ops.quant_repack_(s.data, s.qtype, to_type)
                self.segments[i] = QuantizedSegment(to_type, s.data)

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [s.data for s in self.segments]

    @property
    def type_names(self) -> str:
        return "+".join(QUANT_NAMES[s.qtype] for s in self.segments)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [tokens, in_features] (fp32, or converted to it) -> x W^T + bias in x's dtype."""
        xf = x if x.dtype == torch.float32 else x.float()
        if bias is not None and bias.dtype != torch.float32:
            bias = bias.float()
        if len(self.segments) == 1:
            s = self.segments[0]
            y = self.ops.quant_linear(xf, s.data, s.qtype, bias)
        else:
            y = torch.cat([self.ops.quant_linear(xf, s.data, s.qtype, None) for s in self.segments], dim=1)
            if bias is not None:
                y += bias
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def silu_mlp(self, down: QuantizedWeight, x: torch.Tensor) -> torch.Tensor | None:
        """down(silu(gate) * up) with this weight as the fused gate/up (no biases) in one op call, or None
        where the op does not apply (mixed types in a weight, non-fp32 activations)."""
        if len(self.segments) != 1 or len(down.segments) != 1 or x.dtype != torch.float32:
            return None
        gate_up, d = self.segments[0], down.segments[0]
        return self.ops.quant_silu_mlp(x, gate_up.data, gate_up.qtype, d.data, d.qtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The dequantized rows `ids` (an embedding lookup), fp32 [len(ids), in_features]."""
        if len(self.segments) == 1:
            s = self.segments[0]
            return self.ops.quant_dequantize(s.data, s.qtype, self.in_features, ids)
        return self.dequantize()[ids]

    def dequantize(self) -> torch.Tensor:
        return torch.cat([self.ops.quant_dequantize(s.data, s.qtype, self.in_features, None) for s in self.segments])


def _huge_page_tensor(rows: int, nbytes: int) -> torch.Tensor:
    """An uninitialized uint8 [rows, nbytes] whose pages the kernel may back with 2 MiB pages (Linux, THP in
    `madvise` mode). A decode step streams every weight once: with 4 KiB pages, a TLB miss each 4 KiB held one
    thread's Q8_0 matrix-vector product at ~25 GB/s from DRAM, ~30 with huge pages (Zen 5)."""
    data = torch.empty(rows, nbytes, dtype=torch.uint8)
    if _libc is not None and data.numel() >= _HUGE_PAGE:
        start = -(-data.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE  # whole huge pages inside the buffer
        end = (data.data_ptr() + data.numel()) // _HUGE_PAGE * _HUGE_PAGE
        if end > start:
            _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_HUGEPAGE)
    return data


def embedding(input_ids: torch.Tensor, table, dtype: torch.dtype) -> torch.Tensor:
    """F.embedding on a float table; the looked-up rows dequantized (to `dtype`) on a quantized one."""
    if isinstance(table, QuantizedWeight):
        x = table.rows(input_ids)
        return x if x.dtype == dtype else x.to(dtype)
    return torch.nn.functional.embedding(input_ids, table)
