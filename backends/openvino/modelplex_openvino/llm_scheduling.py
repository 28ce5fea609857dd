"""Whose turn it is: OpenVINO GenAI runs one adapter set per pipeline at a time, so requests wait here by
adapter ("" = the base model) and their groups take turns.

Rules: the group in the pipeline keeps admitting new arrivals only while no other group waits; once one
does, the pipeline drains and the group whose oldest request arrived first goes next (never the group
that just ran, if another waits). So every request waits at most for the requests of one other group
that were already running, and a busy adapter cannot starve a quiet one.
"""
from __future__ import annotations

import itertools
from collections import deque


class AdapterGroups:
    """Invariant: `waiting` holds no empty queue; arrival numbers only grow."""

    def __init__(self):
        self.waiting: dict[str, deque[tuple[int, int]]] = {}  # adapter -> (arrival number, request id)
        self.current: str | None = None  # the adapter whose requests are (or were last) in the pipeline
        self._arrivals = itertools.count()

    def add(self, lora: str, request_id: int) -> None:
        self.waiting.setdefault(lora, deque()).append((next(self._arrivals), request_id))

    def discard(self, lora: str, request_id: int) -> None:
        queue = self.waiting.get(lora)
        if queue is None:
            return
        self.waiting[lora] = deque(item for item in queue if item[1] != request_id)
        if not self.waiting[lora]:
            del self.waiting[lora]

    def num_waiting(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def next_admissions(self, is_running: bool, single_group: bool = False) -> tuple[str | None, list[int]]:
        """(adapter, request ids to add to the pipeline now). `is_running`: requests are in the pipeline.
        `single_group`: no adapter is registered, so every request may run together."""
        if single_group:
            return "", [rid for lora in list(self.waiting) for rid in self._take(lora)]
        others_wait = any(lora != self.current for lora in self.waiting)
        if is_running:
            if self.current in self.waiting and not others_wait:
                return self.current, self._take(self.current)
            return self.current, []
        candidates = [lora for lora in self.waiting if lora != self.current] or list(self.waiting)
        if not candidates:
            return self.current, []
        self.current = min(candidates, key=lambda lora: self.waiting[lora][0][0])
        return self.current, self._take(self.current)

    def _take(self, lora: str) -> list[int]:
        return [request_id for _, request_id in self.waiting.pop(lora, ())]
