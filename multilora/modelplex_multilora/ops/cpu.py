"""The CPU path of the batched LoRA ops: tokens grouped by adapter (mapping.groups, built once a step and
shared by every layer), one batched matmul over the groups for the shrink and one a slice for the expand.

Each token multiplies only by its own adapter's weights. The one-hot form of ops/reference.py multiplies
every token by every slot in use, so its FLOPs grew with the number of adapters in the step (8x at 8
adapters); here they grow with the tokens only (padding at most doubles the rows: mapping.LoRAGroups).
The shrink's result `s` is private to this module: [pieces, piece rows, n * R], the expand's input.
"""
from __future__ import annotations

import torch

from ..mapping import LoRAMapping


def _stack(stack: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
    """The pieces' weights: the stack's first slots as they are, or gathered where a slot spans pieces."""
    groups = mapping.groups
    if groups.piece_slots is None:
        return stack[:groups.num_pieces]
    return stack.index_select(0, groups.piece_slots)


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
    """x [T, in] -> s [pieces, rows, n*R]: each piece's tokens times its slot's A of every slice at once."""
    groups = mapping.groups
    in_features = x.shape[1]
    xg = x.index_select(0, groups.rows).view(groups.num_pieces, groups.piece_size, in_features)
    a = _stack(lora_a, mapping)
    s = torch.bmm(xg, a.view(groups.num_pieces, -1, in_features).transpose(1, 2))
    return s.mul_(groups.mask)  # padding rows (copies of token 0) must add nothing


def lora_expand(y: torch.Tensor, s: torch.Tensor, lora_b: tuple[torch.Tensor, ...], mapping: LoRAMapping) -> None:
    """y [T, sum(out_i)] += each token's s times its slot's B of each slice, added to the tokens' rows once."""
    groups = mapping.groups
    rank = s.shape[2] // len(lora_b)
    deltas = [torch.bmm(s[:, :, i * rank:(i + 1) * rank], _stack(b, mapping)) for i, b in enumerate(lora_b)]
    delta = deltas[0] if len(deltas) == 1 else torch.cat(deltas, dim=2)
    y.index_add_(0, groups.rows, delta.view(groups.num_pieces * groups.piece_size, -1))
