"""Linear layer whose weight can be pre-packed for oneDNN on CPU.

Plain bf16 F.linear on CPU reorders the weight on every call; packing it once (as torch inductor's
freezing pass does) makes small-batch decode matmuls several times faster. fp32 stays plain
F.linear so the fp32 mode keeps HF's exact numerics.
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

    def pack(self, batch_size_hint: int):
        """Replace the weight by oneDNN's blocked layout (bf16 on CPU only)."""
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(self.weight, batch_size_hint)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))
