"""LoRA on a model's projections: each targeted linear layer is wrapped so that, after the base
projection, it adds the LoRA delta of every token's adapter, driven by the step's LoRAMapping.

With no adapter in the step (`context.mapping` None) or none that adapts this projection, the
wrapper only calls the base layer. Weights of all device slots are stacked per projection
(ops/reference.py describes the layout); slot contents change only on the engine thread.
"""
from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from .mapping import LoRAMapping
from .peft import BaseModelShape
from .weights import LoRAWeights


class LoRAContext:
    """Shared by every wrapped layer of one model: the current step's mapping and the ops to run."""

    def __init__(self, ops: ModuleType):
        self.ops = ops
        self.mapping: LoRAMapping | None = None
        self.slots_in_step: frozenset[int] = frozenset()


class LoRALinear(nn.Module):
    """A base projection whose output is `len(modules)` slices (e.g. q, k, v) plus their LoRA deltas."""

    def __init__(self, base: nn.Module, modules: tuple[str, ...], shape: BaseModelShape, max_loras: int,
                 max_rank: int, context: LoRAContext, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.base, self.modules_, self.context = base, modules, context
        in_features = shape.modules[modules[0]][0]
        # [S, n, R, in] as a view of rank-major memory: a step's first r ranks of every slice are one block
        self.lora_a = torch.zeros(max_loras, max_rank, len(modules), in_features, dtype=dtype,
                                  device=device).transpose(1, 2)
        self.lora_b = tuple(torch.zeros(max_loras, max_rank, shape.modules[m][1], dtype=dtype, device=device)
                            for m in modules)
        self.adapted_slots: set[int] = set()  # slots whose adapter has weights for any of `modules`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        mapping = self.context.mapping
        if mapping is None or self.adapted_slots.isdisjoint(self.context.slots_in_step):
            return y
        ops = self.context.ops
        ops.lora_expand(y, ops.lora_shrink(x, self.lora_a, mapping), self.lora_b, mapping)
        return y

    def set_slot(self, slot: int, layer: int, weights: LoRAWeights | None) -> None:
        """Copy an adapter's matrices of this projection into `slot` (zeros where it has none)."""
        self.lora_a[slot].zero_()
        for b in self.lora_b:
            b[slot].zero_()
        self.adapted_slots.discard(slot)
        for i, module in enumerate(self.modules_):
            found = weights.matrices.get((layer, module)) if weights is not None else None
            if found is not None:
                a, b_t = found
                self.lora_a[slot, i, :a.shape[0]].copy_(a)
                self.lora_b[i][slot, :b_t.shape[0]].copy_(b_t)
                self.adapted_slots.add(slot)


class LoRAModel:
    """Wraps the targeted projections of every decoder layer of `model`.

    `model.lora_targets` maps a projection's path inside a decoder layer to the PEFT module names of
    its output slices (e.g. "self_attn.qkv_proj" -> q_proj, k_proj, v_proj); `model.layers` are
    the decoder layers.
    """

    def __init__(self, model: nn.Module, shape: BaseModelShape, max_loras: int, max_rank: int, ops: ModuleType,
                 dtype: torch.dtype, device: torch.device):
        self.context = LoRAContext(ops)
        self.max_loras = max_loras
        self.slot_ranks = [0] * max_loras  # the rank of each slot's adapter (0: empty)
        self.wrapped: list[list[LoRALinear]] = []
        for layer in model.layers:
            wrapped = []
            for path, modules in model.lora_targets.items():
                parent_path, _, name = path.rpartition(".")
                parent = layer.get_submodule(parent_path)
                lora = LoRALinear(getattr(parent, name), tuple(modules), shape, max_loras, max_rank, self.context,
                                  dtype, device)
                setattr(parent, name, lora)
                wrapped.append(lora)
            self.wrapped.append(wrapped)

    def set_slot(self, slot: int, weights: LoRAWeights | None) -> None:
        self.slot_ranks[slot] = 0 if weights is None else weights.spec.rank
        for layer, projections in enumerate(self.wrapped):
            for lora in projections:
                lora.set_slot(slot, layer, weights)

    def set_mapping(self, mapping: LoRAMapping | None) -> None:
        self.context.mapping = mapping
        self.context.slots_in_step = frozenset() if mapping is None else mapping.slots
