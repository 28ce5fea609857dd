"""Linear layer whose weight can be pre-packed for oneDNN on CPU.

Plain bf16 F.linear on CPU reorders the weight on every call, and fp32 F.linear goes to MKL, whose
sgemm on AMD CPUs runs ~10x below oneDNN's AVX2 kernels at decode shapes. Packing the weight once
for oneDNN (as torch inductor's freezing pass does) fixes both; fp32 greedy output stays
token-identical to HF on the parity prompts (tests/native_gpu/test_hf_parity.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.packed_weight: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed_weight is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def pack(self, batch_size_hint: int, keep_weight: bool = False):
        """Hold the weight in oneDNN's blocked layout for CPU matmuls. The plain copy is dropped
        (`weight` becomes None: the model's memory is not twice its weights) unless `keep_weight`:
        something else reads it (a tied embedding)."""
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(self.weight, batch_size_hint)
        if not keep_weight:
            self.weight = None


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packs fp32 anywhere (AVX2 included) and bf16 where the CPU has AVX-512 (its bf16 kernels)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    return dtype == torch.float32
