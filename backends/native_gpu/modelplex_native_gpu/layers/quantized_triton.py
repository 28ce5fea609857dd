"""GGUF-quantized weights on a CUDA device, multiplied by the Triton kernel (kernels/triton_quant.py).

The model loads its quantized tensors as layers/quantized.py's blocks in host memory; `to_device` then
moves every one to the device as planes (kernels/quant_layout.py), tensor by tensor, so the device holds
the file's bits and nothing dequantized. The embedding table stays quantized too: a step dequantizes the
rows it looks up, and a tied LM head multiplies with the same planes (an 8B model's Q4 table in bf16
would be another ~1 GB for a gather of a few rows a step).
"""
from __future__ import annotations

import torch
from torch import nn

from ..kernels.quant_layout import QuantPlanes, dequantize, split_planes
from .quantized import QUANT_NAMES, QuantizedWeight


def available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class TritonQuantizedWeight(QuantizedWeight):
    """A QuantizedWeight whose row segments are planes on one device (a fused q/k/v of mixed types keeps one
    a type, stacked by rows in order). It never holds the CPU blocks nor touches the compiled CPU ops."""

    # No CPU segments: the CPU-only fused paths that look for one (silu_mlp, the one-call decode layer) step aside.
    segments: tuple = ()

    def __init__(self, planes: list[QuantPlanes], in_features: int):  # not QuantizedWeight's: no CPU blocks
        from ..kernels.triton_quant import quant_matmul  # imports triton: only where these weights exist

        self.matmul = quant_matmul
        self.planes = planes
        self.in_features = in_features
        self.out_features = sum(p.rows for p in planes)

    @classmethod
    def from_blocks(cls, weight: QuantizedWeight, device: torch.device) -> TritonQuantizedWeight:
        return cls([split_planes(s.data, s.qtype, weight.in_features).map(lambda t: t.to(device))
                    for s in weight.segments], weight.in_features)

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [t for p in self.planes for t in p.tensors()]

    @property
    def type_names(self) -> str:
        return "+".join(QUANT_NAMES[p.qtype] for p in self.planes)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [tokens, in_features] -> x W^T + bias in x's dtype (each segment writes its columns in place)."""
        if x.stride(-1) != 1:
            x = x.contiguous()
        if len(self.planes) == 1:
            return self.matmul(x, self.planes[0], bias)
        out = torch.empty(x.shape[0], self.out_features, dtype=x.dtype, device=x.device)
        start = 0
        for p in self.planes:
            end = start + p.rows
            self.matmul(x, p, None if bias is None else bias[start:end], out=out[:, start:end])
            start = end
        return out

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The dequantized rows `ids` (an embedding lookup), fp32 [len(ids), in_features]."""
        if len(self.planes) == 1:
            return dequantize(self.planes[0].map(lambda t: t[ids]))
        return self.dequantize()[ids]

    def dequantize(self) -> torch.Tensor:
        return torch.cat([dequantize(p) for p in self.planes])


def to_device(model: nn.Module, device: torch.device) -> int:
    """Replace every QuantizedWeight the model's modules hold (linears' `quantized`, a quantized embedding
    table) by its planes on `device`; one shared by a tied LM head stays shared. Returns how many moved."""
    moved: dict[int, TritonQuantizedWeight] = {}
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, QuantizedWeight) and not isinstance(value, TritonQuantizedWeight):
                if id(value) not in moved:
                    moved[id(value)] = TritonQuantizedWeight.from_blocks(value, device)
                setattr(module, name, moved[id(value)])
    return len(moved)
