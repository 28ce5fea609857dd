"""LoRAManager: one engine's adapters in three tiers: folders on disk, a host-memory LRU cache
(`max_cpu_loras`) and `max_loras` device slots in the stacked per-layer tensors.

Disk reads happen in the caller's thread (the serving layer calls them off the event loop); slot
copies happen on the engine thread when the scheduler admits a request. Invariants: an adapter
pinned by requests in flight keeps its host copy; one with running requests keeps its slot.
Every method is thread-safe (one lock; disk reads run outside it).
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from modelplex import NotFound

from .layers import LoRAModel
from .peft import AdapterSpec, BaseModelShape, InvalidAdapterError, read_adapter
from .weights import LoRAWeights, load_weights


@dataclass
class LoRAConfig:
    max_loras: int  # device slots: the most distinct adapters in one step
    max_lora_rank: int
    max_cpu_loras: int  # adapters kept in host memory (pinned ones may exceed it)


@dataclass
class LoRAAdapter:
    """A registered adapter. `lora_id` is new on every load, so a reloaded adapter never shares
    prefix-cache blocks with its predecessor."""

    name: str
    lora_id: int
    spec: AdapterSpec
    num_pins: int = 0  # requests added and not finished
    unloading: bool = False
    counters: dict[str, int] = field(default_factory=lambda: {"requests": 0, "disk_loads": 0, "slot_loads": 0,
                                                              "slot_evictions": 0, "cpu_evictions": 0})


class LoRAManager:
    def __init__(self, model: LoRAModel, shape: BaseModelShape, config: LoRAConfig, dtype: torch.dtype):
        self.model, self.shape, self.config, self.dtype = model, shape, config, dtype
        self._lock = threading.Lock()
        self.adapters: dict[str, LoRAAdapter] = {}
        self._by_id: dict[int, LoRAAdapter] = {}
        self._cpu: OrderedDict[int, LoRAWeights] = OrderedDict()  # least recently used first
        self._slots: list[int | None] = [None] * config.max_loras  # slot -> lora_id
        self._slot_of: dict[int, int] = {}
        self._slot_ticks = [0] * config.max_loras  # when each slot was last admitted to
        self._tick = itertools.count(1)
        self._ids = itertools.count(1)

    # ---- registry (any thread; blocking disk reads) -------------------------------------------
    def register(self, name: str, path: Path) -> LoRAAdapter:
        """Read, check and cache adapter `name`; InvalidAdapterError with the reason leaves nothing."""
        if name in self.adapters:
            raise InvalidAdapterError(f"adapter '{name}' is already loaded")
        spec = read_adapter(path, self.shape, self.config.max_lora_rank)
        weights = load_weights(spec, self.dtype)
        with self._lock:
            if name in self.adapters:
                raise InvalidAdapterError(f"adapter '{name}' is already loaded")
            adapter = LoRAAdapter(name, next(self._ids), spec)
            adapter.counters["disk_loads"] += 1
            self.adapters[name] = self._by_id[adapter.lora_id] = adapter
            self._cache(adapter.lora_id, weights)
        return adapter

    def is_cached(self, name: str) -> bool:
        adapter = self.adapters.get(name)
        return adapter is not None and adapter.lora_id in self._cpu

    def prefetch(self, name: str) -> None:
        """Bring an adapter's weights back into host memory (a disk read) if they were dropped."""
        adapter = self.adapters.get(name)
        if adapter is not None and adapter.lora_id not in self._cpu:
            weights = load_weights(adapter.spec, self.dtype)
            with self._lock:
                if adapter.lora_id in self._by_id and adapter.lora_id not in self._cpu:
                    adapter.counters["disk_loads"] += 1
                    self._cache(adapter.lora_id, weights)

    def acquire(self, name: str) -> int:
        """Pin adapter `name` for one request; its id. NotFound when unknown or being unloaded."""
        with self._lock:
            adapter = self.adapters.get(name)
            if adapter is None or adapter.unloading:
                raise NotFound(f"adapter '{name}' is not loaded")
            adapter.num_pins += 1
            adapter.counters["requests"] += 1
            cached = adapter.lora_id in self._cpu
        if not cached:
            self.prefetch(name)
        return adapter.lora_id

    def release(self, lora_id: int) -> None:
        with self._lock:
            adapter = self._by_id.get(lora_id)
            if adapter is not None:
                adapter.num_pins -= 1

    def begin_unload(self, name: str) -> LoRAAdapter:
        """New requests for `name` are refused from now on; `num_pins` counts the ones still in flight."""
        with self._lock:
            adapter = self.adapters.get(name)
            if adapter is None or adapter.unloading:
                raise NotFound(f"adapter '{name}' is not loaded")
            adapter.unloading = True
            return adapter

    def finish_unload(self, adapter: LoRAAdapter) -> None:
        """Forget an adapter whose requests all finished: host copy and slot are free again."""
        with self._lock:
            self.adapters.pop(adapter.name, None)
            self._by_id.pop(adapter.lora_id, None)
            self._cpu.pop(adapter.lora_id, None)
            slot = self._slot_of.pop(adapter.lora_id, None)
            if slot is not None:
                self._slots[slot] = None

    def rows(self) -> list[dict]:
        with self._lock:
            return [{"name": a.name, "source": str(a.spec.path), "state": "UNLOADING" if a.unloading else "READY",
                     **a.spec.summary(), "in_host_memory": a.lora_id in self._cpu,
                     "slot": self._slot_of.get(a.lora_id), "num_requests_in_flight": a.num_pins, **a.counters}
                    for a in self.adapters.values()]

    def _cache(self, lora_id: int, weights: LoRAWeights) -> None:
        """Insert as most recent; drop least recent unpinned copies beyond max_cpu_loras (lock held)."""
        self._cpu[lora_id] = weights
        self._cpu.move_to_end(lora_id)
        for old in list(self._cpu):
            if len(self._cpu) <= self.config.max_cpu_loras:
                break
            adapter = self._by_id.get(old)
            if old != lora_id and (adapter is None or adapter.num_pins == 0):
                del self._cpu[old]
                if adapter is not None:
                    adapter.counters["cpu_evictions"] += 1

    # ---- device slots (engine thread) ---------------------------------------------------------
    def slot_of(self, lora_id: int) -> int | None:
        return self._slot_of.get(lora_id)

    def activate(self, lora_id: int, busy: set[int]) -> int | None:
        """The slot holding `lora_id`, copying it into a free slot or into the least recently used
        slot whose adapter is not in `busy` (has no running request). None: every slot is busy."""
        with self._lock:
            slot = self._slot_of.get(lora_id)
            if slot is None:
                slot = self._free_slot(busy)
                if slot is None:
                    return None
                self._load_slot(slot, lora_id)
            self._slot_ticks[slot] = next(self._tick)
            return slot

    def least_recent_busy(self, busy: set[int]) -> int | None:
        """The busy resident adapter admitted to longest ago: the one to drain for a waiting adapter."""
        with self._lock:
            slots = [s for s, lid in enumerate(self._slots) if lid is not None and lid in busy]
            return self._slots[min(slots, key=self._slot_ticks.__getitem__)] if slots else None

    def _free_slot(self, busy: set[int]) -> int | None:
        free = [s for s, lid in enumerate(self._slots) if lid is None]
        if free:
            return free[0]
        idle = [s for s, lid in enumerate(self._slots) if lid not in busy]
        if not idle:
            return None
        slot = min(idle, key=self._slot_ticks.__getitem__)
        evicted = self._by_id.get(self._slots[slot])
        if evicted is not None:
            evicted.counters["slot_evictions"] += 1
        del self._slot_of[self._slots[slot]]
        self._slots[slot] = None
        return slot

    def _load_slot(self, slot: int, lora_id: int) -> None:
        adapter = self._by_id[lora_id]
        weights = self._cpu.get(lora_id)
        if weights is None:  # dropped from host memory although pinned: only if the cache was overfull
            weights = load_weights(adapter.spec, self.dtype)
            adapter.counters["disk_loads"] += 1
            self._cache(lora_id, weights)
        self.model.set_slot(slot, weights)
        self._slots[slot], self._slot_of[lora_id] = lora_id, slot
        adapter.counters["slot_loads"] += 1
