"""LoRAAdmission: which waiting requests may start, so that the adapters of running requests always
fit in the `max_loras` device slots and no adapter waits forever.

A request whose adapter has (or can take) a slot starts as usual. When none can be freed (every
slot's adapter has running requests), the busy adapter admitted to longest ago starts draining: its
waiting requests are held back until its running ones finish, and the freed slot goes to the first
waiting request that needs one. Adapters thus take turns (fair rotation, as LoRAX does) while
requests for resident adapters and for the base model keep flowing.
"""
from __future__ import annotations

from collections import Counter

from .manager import LoRAManager


class LoRAAdmission:
    def __init__(self, manager: LoRAManager):
        self.manager = manager
        self.draining: int | None = None  # lora_id held back so its slot frees up
        self._busy: Counter = Counter()

    def begin_step(self, running) -> None:
        """Called before admitting waiting requests, with the requests running now."""
        self._busy = Counter(r.lora_id for r in running if r.lora_id is not None)
        if self.draining is not None and self.manager.slot_of(self.draining) is None:
            self.draining = None  # evicted or unloaded meanwhile

    def admit(self, request) -> bool:
        """True when the request may start now (its adapter is then in a slot)."""
        lora_id = request.lora_id
        if lora_id is None:
            return True
        if lora_id == self.draining:
            return False
        resident = self.manager.slot_of(lora_id) is not None
        if self.manager.activate(lora_id, set(self._busy)) is None:
            if self.draining is None:
                self.draining = self.manager.least_recent_busy(set(self._busy))
            return False
        if not resident:
            self.draining = None  # the waiting adapter got its slot: this turn is over
        self._busy[lora_id] += 1
        return True
