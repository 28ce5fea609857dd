"""Which sequence holds which slot: Triton's sequence-slot bookkeeping, with no timing and no tensors.

Each instance has `num_slots` slots. A starting sequence takes the free slot with the lowest
(slot, instance) index, or waits in the backlog (its requests queued with it) until an ending or idle
sequence frees one. A sequence keeps its slot, and so its instance, until it ends: that is the
affinity stateful models rely on.
"""
from __future__ import annotations

import asyncio
import collections
import heapq
from dataclasses import dataclass, field

import numpy as np

from ..core.tensors import InferRequest


@dataclass(eq=False, slots=True)
class SequenceRequest:
    """One request of a sequence from admission to its response; read by `ModelVersion` like the
    dynamic batcher's `PendingRequest` (`future`, `queue_ns`, `infer_ns`, `batch_total`)."""

    request: InferRequest
    sequence: Sequence
    start: bool
    end: bool
    enqueue_ns: int
    future: asyncio.Future
    queue_ns: int = 0
    infer_ns: int = 0
    batch_total: int = 0
    started: bool = False


@dataclass(eq=False, slots=True)
class Sequence:
    """A sequence between its START and its END (or idle timeout). `num_busy` counts its requests
    queued or running; `states` holds its implicit states (None: the initial ones)."""

    corrid: int | str
    slot: Slot | None = None
    backlog: collections.deque = field(default_factory=collections.deque)  # requests while it has no slot
    states: dict[str, np.ndarray] | None = None
    last_ns: int = 0
    num_busy: int = 0


@dataclass(eq=False, slots=True)
class Slot:
    instance_index: int
    index: int
    sequence: Sequence | None = None
    queue: collections.deque = field(default_factory=collections.deque)  # SequenceRequest, oldest first


class SlotTable:
    """Invariant: a slot holds at most one sequence and a sequence at most one slot; a sequence without
    a slot is in `backlog` exactly while it has requests waiting."""

    def __init__(self, num_instances: int, num_slots: int):
        self.slots = [[Slot(i, s) for s in range(num_slots)] for i in range(num_instances)]
        self._free = [(s, i) for i in range(num_instances) for s in range(num_slots)]
        heapq.heapify(self._free)
        self.backlog: collections.deque[Sequence] = collections.deque()

    def assign(self, sequence: Sequence) -> Slot | None:
        """A free slot for a new sequence, or None (it goes to the backlog)."""
        if not self._free:
            self.backlog.append(sequence)
            return None
        index, instance = heapq.heappop(self._free)
        return self._bind(self.slots[instance][index], sequence)

    def release(self, slot: Slot, sequence: Sequence) -> Slot | None:
        """`sequence` no longer needs `slot`: the oldest backlogged sequence takes it (returned, its
        requests moved to the slot's queue), or it becomes free."""
        if slot.sequence is not sequence:
            return None
        sequence.slot, slot.sequence = None, None
        if self.backlog:
            waiting = self.backlog.popleft()
            self._bind(slot, waiting)
            slot.queue.extend(waiting.backlog)
            waiting.backlog.clear()
            return slot
        heapq.heappush(self._free, (slot.index, slot.instance_index))
        return None

    def drop_backlogged(self, sequence: Sequence) -> None:
        if sequence.slot is None and sequence in self.backlog:
            self.backlog.remove(sequence)

    @staticmethod
    def _bind(slot: Slot, sequence: Sequence) -> Slot:
        slot.sequence, sequence.slot = sequence, slot
        return slot
