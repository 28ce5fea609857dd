"""LoRAMapping: which device slot each token of one step uses, built once per step by the runner."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LoRAMapping:
    """`token_slots[t]` is token t's slot (-1: no adapter). `slot_onehot[t, s]` is 1.0 where token t
    uses slot s, for the first `num_slots` slots (every slot in use sits below it); the torch ops
    use the one-hot form, the Triton kernels the slot ids."""

    token_slots: torch.Tensor  # [T] int32
    slot_onehot: torch.Tensor  # [T, num_slots], the compute dtype
    num_slots: int
    slots: frozenset[int]  # the slots some token uses

    @classmethod
    def build(cls, request_slots: list[int], num_tokens: list[int], dtype: torch.dtype,
              device: torch.device) -> LoRAMapping | None:
        """From each request's slot and scheduled token count; None when no request has an adapter
        (the layers then skip LoRA entirely)."""
        num_slots = max(request_slots, default=-1) + 1
        if num_slots == 0:
            return None
        per_request = torch.tensor(request_slots, dtype=torch.int32)
        token_slots = torch.repeat_interleave(per_request, torch.tensor(num_tokens))
        onehot = torch.zeros(len(token_slots), num_slots + 1, dtype=dtype)
        onehot[torch.arange(len(token_slots)), token_slots.long()] = 1  # -1 lands in the extra last column
        return cls(token_slots.to(device), onehot[:, :num_slots].contiguous().to(device), num_slots,
                   frozenset(request_slots) - {-1})
