"""The CPU path of the batched LoRA ops: reference.py's math, with the stacked weights packed for oneDNN.

fp32 `F.linear`/`addmm` go to MKL, whose sgemm runs several times below oneDNN's packed AVX2 kernels at
these shapes on AMD CPUs (the engine packs its base projections for the same reason). A packed copy is
rebuilt when a slot's weights change (the stack's version counter moves: slots are written in place) or
a step uses a different number of slots. Other dtypes keep the reference ops.
"""
from __future__ import annotations

import weakref

import torch

from ..mapping import LoRAMapping
from . import reference

_packed: dict[int, tuple] = {}  # id(stack) -> (num_slots, version, packed); dropped with the stack


def _packed_weight(stack: torch.Tensor, num_slots: int, weight) -> torch.Tensor:
    """oneDNN's packed copy of `weight()` ([out, in], built from `stack[:num_slots]`), cached per stack."""
    key = id(stack)
    cached = _packed.get(key)
    if cached is None:
        weakref.finalize(stack, _packed.pop, key, None)
    if cached is None or cached[:2] != (num_slots, stack._version):
        cached = (num_slots, stack._version, torch.ops.mkldnn._reorder_linear_weight(weight(), 64))
        _packed[key] = cached
    return cached[2]


def _linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def _shrink_linear(x: torch.Tensor, lora_a: torch.Tensor, k: int) -> torch.Tensor:
    return _linear(x, _packed_weight(lora_a, k, lambda: lora_a[:k].reshape(-1, lora_a.shape[-1]).contiguous()))


def _expand_add(y: torch.Tensor, spread: torch.Tensor, b: torch.Tensor, k: int) -> None:
    y += _linear(spread, _packed_weight(b, k, lambda: b[:k].reshape(-1, b.shape[-1]).t().contiguous()))


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
    return reference.lora_shrink(x, lora_a, mapping, _shrink_linear if x.dtype == torch.float32 else None)


def lora_expand(y: torch.Tensor, s: torch.Tensor, lora_b: tuple[torch.Tensor, ...], mapping: LoRAMapping) -> None:
    reference.lora_expand(y, s, lora_b, mapping, _expand_add if y.dtype == torch.float32 else None)
