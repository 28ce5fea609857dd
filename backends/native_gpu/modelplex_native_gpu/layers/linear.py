"""Linear layer whose weight can be pre-packed for the CPU.

Plain bf16 F.linear on CPU reorders the weight on every call, and fp32 F.linear goes to MKL, whose
sgemm on AMD CPUs runs ~10x below oneDNN's AVX2 kernels at decode shapes. So the weight is packed
once: fp32 into our own column panels (kernels/csrc/linear.cpp: memory-speed at one token, where
oneDNN's call overhead alone was ~11 us; at or above oneDNN's rate at 8-256 tokens), bf16 into our
panels of k pairs for vdpbf16ps where the CPU has AVX512_BF16 (kernels/csrc/linear_bf16.cpp:
benchmarks/results/linear_bf16.md), else for oneDNN (as torch inductor's freezing pass does). fp32
greedy output stays token-identical to HF on the parity prompts (tests/native_gpu/test_hf_parity.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .quantized import QuantizedWeight, is_quantized_source


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.out_features = out_features
        self.packed_weight: torch.Tensor | None = None
        self.cpu_linear = None  # the compiled op multiplying packed_weight in our panels; None: oneDNN's layout
        self.quantized: QuantizedWeight | None = None  # a GGUF file's blocks (then weight is None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [tokens, in_features]."""
        if self.quantized is not None:
            return self.quantized.linear(x, self.bias)
        if self.packed_weight is None:
            return F.linear(x, self.weight, self.bias)
        if self.cpu_linear is not None:
            return self.cpu_linear(x, self.packed_weight, self.out_features, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def forward_fp32(self, x: torch.Tensor) -> torch.Tensor:
        """The product in fp32 (the logits): our bf16 panels write their fp32 sums instead of rounding them to
        bf16 and converting back."""
        if self.cpu_linear is not None and self.packed_weight.dtype == torch.bfloat16:
            return self.cpu_linear(x, self.packed_weight, self.out_features, self.bias, torch.float32)
        return self.forward(x).float()

    def load(self, parts: list) -> None:
        """Take the weight from its output slices in order (q, k, v; gate, up; or one): float tensors are
        copied into `weight`; quantized ones (lazy loader sources, or a QuantizedWeight already read, such as
        a tied embedding) are kept as they are and `weight` is dropped."""
        if isinstance(parts[0], QuantizedWeight):
            self.quantized, self.weight = parts[0], None
        elif is_quantized_source(parts[0]):
            self.quantized, self.weight = QuantizedWeight.read(parts), None
        else:
            self.weight.copy_(torch.cat(parts) if len(parts) > 1 else parts[0])

    def weight_tensors(self) -> list[torch.Tensor]:
        """The tensors a matmul reads: the packed copy where packed, the quantized blocks, else the weight."""
        if self.quantized is not None:
            return self.quantized.tensors
        return [self.weight if self.packed_weight is None else self.packed_weight]

    def pack(self, batch_size_hint: int, keep_weight: bool = False, cpu_ops=None):
        """Hold the weight packed for CPU matmuls: in our panels when the weight is fp32 and `cpu_ops` (the
        compiled torch.ops.modelplex_cpu) is given, or bf16 and they have the bf16 linear (built where the
        CPU has AVX512_BF16), else in oneDNN's blocked layout for `batch_size_hint` rows. The plain copy is
        dropped (`weight` becomes None: the model's memory is not twice its weights) unless `keep_weight`:
        something else reads it (a tied embedding). Quantized weights stay in their
        blocks, repacked in place where the CPU kernels prefer (Q4_0, Q4_1)."""
        if self.quantized is not None:
            self.quantized.repack()
            return
        if cpu_ops is not None and self.weight.dtype == torch.float32:
            self.packed_weight, self.cpu_linear = cpu_ops.pack_linear_weight(self.weight), cpu_ops.packed_linear
        elif self.weight.dtype == torch.bfloat16 and cpu_ops is not None and hasattr(cpu_ops, "packed_linear_bf16"):
            self.packed_weight = cpu_ops.pack_linear_weight_bf16(self.weight)
            self.cpu_linear = cpu_ops.packed_linear_bf16
        else:
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
