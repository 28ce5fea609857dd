"""The engine's LoRA glue: wraps the runner's model with modelplex_multilora and builds each step's
token -> slot mapping. Only loaded when the engine config asks for LoRA (max_loras > 0)."""
from __future__ import annotations

from modelplex_multilora.layers import LoRAModel
from modelplex_multilora.manager import LoRAConfig, LoRAManager
from modelplex_multilora.mapping import LoRAMapping
from modelplex_multilora.peft import BaseModelShape
from modelplex_multilora.scheduling import LoRAAdmission

from ..config import EngineConfig


class EngineLoRA:
    """The manager (registry, host cache, slots), the scheduler's admission rule and the wrapped model."""

    def __init__(self, config: EngineConfig, runner):
        arch = runner.arch
        shape = BaseModelShape.llama(arch.hidden_size, arch.intermediate_size, arch.num_hidden_layers,
                                     arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim)
        if runner.device.type == "cuda":
            from modelplex_multilora.ops import triton_lora as ops
        else:
            from modelplex_multilora.ops import cpu as ops
        self.model = LoRAModel(runner.model, shape, config.max_loras, config.max_lora_rank, ops, runner.dtype,
                               runner.device)
        max_cpu = config.max_cpu_loras or max(4 * config.max_loras, 16)
        self.manager = LoRAManager(self.model, shape, LoRAConfig(config.max_loras, config.max_lora_rank, max_cpu),
                                   runner.dtype)
        self.admission = LoRAAdmission(self.manager)
        self.device, self.dtype = runner.device, runner.dtype

    def set_step(self, requests, num_scheduled_tokens: list[int]) -> None:
        """The mapping of the step about to run (None, and no LoRA work, when no request has an adapter)."""
        slot_of = self.manager.slot_of
        slots = [-1 if r.lora_id is None else slot_of(r.lora_id) for r in requests]
        max_rank = max((self.model.slot_ranks[s] for s in slots if s >= 0), default=0)
        self.model.set_mapping(LoRAMapping.build(slots, num_scheduled_tokens, self.dtype, self.device, max_rank))

    def stats(self, scheduler) -> dict:
        """Adapters of running and waiting requests and each adapter's counters (read from any thread)."""
        names = {a.lora_id: a.name for a in list(self.manager.adapters.values())}

        def adapters_of(requests) -> list[str]:
            return sorted({names[r.lora_id] for r in list(requests) if r.lora_id in names})

        return {"max_loras": self.manager.config.max_loras, "running": adapters_of(scheduler.running),
                "waiting": adapters_of(scheduler.waiting), "adapters": self.manager.rows()}
