"""Batched LoRA ops in torch: the reference the CPU ops (ops/cpu.py) and the Triton kernels are tested against.

A projection's LoRA weights for every device slot are stacked: `lora_a` [S, n, R, in] (n slices of
one fused projection, e.g. q/k/v; ranks zero-padded to R) and one `lora_b` [S, R, out_i] per slice,
with the adapter's scaling folded in. Each token uses its own slot: the shrink multiplies by every
slot in use at once (one matmul) and keeps the token's own; the expand scatters a token's rank
vector into its slot's rows and multiplies once. Its FLOPs grow with the slots in use, not with the
tokens' adapters; ops/cpu.py groups the tokens by adapter instead.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..mapping import LoRAMapping


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, mapping: LoRAMapping, linear=None) -> torch.Tensor:
    """x [T, in] -> s [T, n, R] with s[t, i] = lora_a[slot(t), i] @ x[t] (zero without a slot).

    `linear(x, lora_a, k)` multiplies x by the first k slots' stack as one [k*n*R, in] matrix
    (F.linear here; ops/cpu.py passes oneDNN's)."""
    k = mapping.num_slots
    _, n, rank, _ = lora_a.shape
    every = (linear or _shrink_linear)(x, lora_a, k)  # [T, k*n*R]
    own = every.view(-1, k, n * rank) * mapping.slot_onehot.unsqueeze(-1)
    return own.sum(1).view(-1, n, rank)


def lora_expand(y: torch.Tensor, s: torch.Tensor, lora_b: tuple[torch.Tensor, ...], mapping: LoRAMapping,
                add_product=None) -> None:
    """y [T, sum(out_i)] += per slice i: s[t, i] @ lora_b[i][slot(t)], into y's columns of slice i.

    `add_product(y_i, spread_i, b, k)` adds spread_i [T, k*R] @ (b's first k slots as [k*R, out_i]) to y_i."""
    k = mapping.num_slots
    num_tokens, n, rank = s.shape
    spread = s.unsqueeze(2) * mapping.slot_onehot.view(num_tokens, 1, k, 1)  # [T, n, k, R]
    offset = 0
    for i, b in enumerate(lora_b):
        out_features = b.shape[-1]
        (add_product or _expand_addmm)(y[:, offset:offset + out_features], spread[:, i].reshape(num_tokens, k * rank),
                                       b, k)
        offset += out_features


def _shrink_linear(x: torch.Tensor, lora_a: torch.Tensor, k: int) -> torch.Tensor:
    return F.linear(x, lora_a[:k].reshape(-1, lora_a.shape[-1]))


def _expand_addmm(y: torch.Tensor, spread: torch.Tensor, b: torch.Tensor, k: int) -> None:
    y.addmm_(spread, b[:k].reshape(-1, b.shape[-1]))
