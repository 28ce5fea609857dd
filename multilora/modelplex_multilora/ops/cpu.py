"""The CPU path of the batched LoRA ops: tokens grouped by adapter (mapping.groups, built once a step and
shared by every layer), one batched matmul over the groups for the shrink and one a slice for the expand.

Each token multiplies only by its own adapter's weights. The one-hot form of ops/reference.py multiplies
every token by every slot in use, so its FLOPs grew with the number of adapters in the step (8x at 8
adapters); here they grow with the tokens only (padding at most doubles the rows: mapping.LoRAGroups).
The shrink's result `s` is private to this module: [pieces, piece rows, n, r], the expand's input.
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
    """x [T, in] -> s [pieces, rows, n, r]: each piece's tokens times its slot's A of every slice at once,
    over the step's ranks r only (layers.LoRALinear keeps A rank-major, so they are one block: no copy)."""
    groups = mapping.groups
    _, n, max_rank, in_features = lora_a.shape
    rank = min(mapping.max_rank or max_rank, max_rank)
    xg = x.index_select(0, groups.rows).view(groups.num_pieces, groups.piece_size, in_features)
    a = _stack(lora_a.transpose(1, 2)[:, :rank], mapping).reshape(groups.num_pieces, rank * n, in_features)
    s = torch.bmm(xg, a.transpose(1, 2)).view(groups.num_pieces, groups.piece_size, rank, n)
    # slice-major for the expand; padding rows (copies of token 0) zeroed: they must add nothing
    return torch.mul(s.transpose(2, 3), groups.mask.unsqueeze(-1),
                     out=s.new_empty(groups.num_pieces, groups.piece_size, n, rank))


def lora_expand(y: torch.Tensor, s: torch.Tensor, lora_b: tuple[torch.Tensor, ...], mapping: LoRAMapping) -> None:
    """y [T, sum(out_i)] += each token's s times its slot's B of each slice, added to the tokens' rows once."""
    groups = mapping.groups
    rank = s.shape[3]
    deltas = [torch.bmm(s[:, :, i], _stack(b[:, :rank], mapping)) for i, b in enumerate(lora_b)]
    delta = deltas[0] if len(deltas) == 1 else torch.cat(deltas, dim=2)
    y.index_add_(0, groups.rows, delta.view(groups.num_pieces * groups.piece_size, -1))
