"""LoRAMapping: which device slot each token of one step uses, built once per step by the runner."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LoRAGroups:
    """The step's adapted tokens grouped by slot into `num_pieces` pieces of `piece_size` rows, for batched
    matmuls (ops/cpu.py): piece p holds tokens `rows[p]` of slot `piece_slots[p]`. A group longer than
    `piece_size` spans several pieces; padding rows point at token 0 with `mask` 0, so their delta is zero.
    Pieces are sized so that padding at most doubles the rows. When piece p is slot p for every p
    (`piece_slots` None), a stack's first `num_pieces` slots are the pieces' weights, with no copy."""

    rows: torch.Tensor  # [num_pieces * piece_size] int64 token index
    mask: torch.Tensor  # [num_pieces, piece_size, 1], the compute dtype: 1 for a token, 0 for padding
    piece_slots: torch.Tensor | None  # [num_pieces] int64, or None for slots 0..num_pieces-1
    num_pieces: int
    piece_size: int

    @classmethod
    def build(cls, token_slots: torch.Tensor, num_slots: int, dtype: torch.dtype) -> LoRAGroups:
        """From the tokens' slots (CPU, -1 for none; at least one token has a slot)."""
        slots = token_slots.long()
        counts = torch.bincount(slots + 1, minlength=num_slots + 1)[1:].tolist()
        used = [c for c in counts if c]
        total = sum(used)
        order = torch.argsort(slots, stable=True)[len(slots) - total:]  # the -1 tokens sort first
        piece_size = -(-total // len(used))  # the mean group: one piece a slot when groups are even
        if max(used) <= piece_size and num_slots * piece_size <= 2 * total:  # one piece a slot, even empty ones
            piece_slots, piece_counts = None, counts
        else:
            piece_slots, piece_counts = [], []
            for slot, count in enumerate(counts):
                for start in range(0, count, piece_size):
                    piece_slots.append(slot)
                    piece_counts.append(min(piece_size, count - start))
        num_pieces = len(piece_counts)
        rows = torch.zeros(num_pieces, piece_size, dtype=torch.int64)
        mask = torch.zeros(num_pieces, piece_size, 1, dtype=dtype)
        start = 0
        for p, count in enumerate(piece_counts):
            rows[p, :count] = order[start:start + count]
            mask[p, :count] = 1
            start += count
        return cls(rows.view(-1), mask, None if piece_slots is None else torch.tensor(piece_slots), num_pieces,
                   piece_size)


@dataclass
class LoRAMapping:
    """`token_slots[t]` is token t's slot (-1: no adapter). `slot_onehot[t, s]` is 1.0 where token t
    uses slot s, for the first `num_slots` slots (every slot in use sits below it); the torch reference
    ops use the one-hot form, the CPU ops `groups` (None on CUDA), the Triton kernels the slot ids.
    `max_rank`: no adapter of the step has a higher rank (the stacks' ranks beyond it are zero padding the
    CPU ops skip), or None."""

    token_slots: torch.Tensor  # [T] int32
    slot_onehot: torch.Tensor  # [T, num_slots], the compute dtype
    num_slots: int
    slots: frozenset[int]  # the slots some token uses
    groups: LoRAGroups | None
    max_rank: int | None = None

    @classmethod
    def build(cls, request_slots: list[int], num_tokens: list[int], dtype: torch.dtype,
              device: torch.device, max_rank: int | None = None) -> LoRAMapping | None:
        """From each request's slot and scheduled token count; None when no request has an adapter
        (the layers then skip LoRA entirely)."""
        num_slots = max(request_slots, default=-1) + 1
        if num_slots == 0:
            return None
        per_request = torch.tensor(request_slots, dtype=torch.int32)
        token_slots = torch.repeat_interleave(per_request, torch.tensor(num_tokens))
        onehot = torch.zeros(len(token_slots), num_slots + 1, dtype=dtype)
        onehot[torch.arange(len(token_slots)), token_slots.long()] = 1  # -1 lands in the extra last column
        groups = LoRAGroups.build(token_slots, num_slots, dtype) if device.type == "cpu" else None
        return cls(token_slots.to(device), onehot[:, :num_slots].contiguous().to(device), num_slots,
                   frozenset(request_slots) - {-1}, groups, max_rank)
