"""Triton's sequence batcher: the requests of one sequence (`sequence_id`) run in order on the instance
and slot it was given at START, with the control tensors (START, END, READY, CORRID) and implicit
states the model declares in `sequence_batching` added to each request.

`direct`: each instance runs a batch of one request per slot, slot i at row i; a slot with nothing
queued below the highest busy one gets a padding request (READY false) so rows stay put.
`oldest`: each instance batches the oldest heads of its slots' queues, up to max_batch_size, waiting
up to max_queue_delay for a preferred batch size. Idle sequences are released after
max_sequence_idle_microseconds. Errors use Triton's texts; a refused request changes nothing.
"""
from __future__ import annotations

import asyncio
import logging
import time

from ..core.errors import InternalError, InvalidInput, ModelplexError, Unavailable
from ..core.tensors import InferRequest
from ..observability.stats import ModelStats
from .batch_merge import merge_requests, split_response
from .sequence_config import MAX_STRING_ID_BYTES, SequenceSettings
from .sequence_slots import Sequence, SequenceRequest, Slot, SlotTable
from .sequence_tensors import prepare_request, take_states

log = logging.getLogger(__name__)
_now = time.perf_counter_ns
_CORRID_RANGES = {"TYPE_UINT64": (0, 2**64 - 1), "TYPE_INT64": (1 - 2**63, 2**63 - 1),
                  "TYPE_UINT32": (0, 2**32 - 1), "TYPE_INT32": (1 - 2**31, 2**31 - 1)}


class SequenceBatcher:
    """Invariant: `_sequences` maps the id of every sequence started and not yet ended or reaped;
    each instance's task is the only caller of that instance."""

    def __init__(self, settings: SequenceSettings, instances: list, stats: ModelStats,
                 merges_batches: bool = False, output_names: tuple[str, ...] = ()):
        self.settings, self.model = settings, settings.model
        self._instances, self._stats, self.merges_batches = instances, stats, merges_batches
        self._output_names = output_names
        self._sequences: dict[int | str, Sequence] = {}
        self._table: SlotTable | None = None
        self._wakeups: list[asyncio.Event] = []
        self._tasks: list[asyncio.Task] = []
        self._reaper_wakeup = asyncio.Event()

    def start(self, num_instances: int) -> None:
        self._table = SlotTable(num_instances, self.settings.num_slots)
        self._wakeups = [asyncio.Event() for _ in range(num_instances)]
        self._tasks = [asyncio.create_task(self._serve(i), name=f"sequence-batcher-{self.model}-{i}")
                       for i in range(num_instances)]
        self._tasks.append(asyncio.create_task(self._reap(), name=f"sequence-reaper-{self.model}"))

    def close(self) -> None:
        """Stop and fail whatever is still queued (the model is going away)."""
        for task in self._tasks:
            task.cancel()
        error = Unavailable(f"model '{self.model}' is unloading")
        for slots in self._table.slots if self._table else ():
            for slot in slots:
                for pending in slot.queue:
                    _settle(pending, error)
        for sequence in self._table.backlog if self._table else ():
            for pending in sequence.backlog:
                _settle(pending, error)

    # ---- admission ----------------------------------------------------------------------
    async def run(self, request: InferRequest, batch_size: int, enqueue_ns: int) -> SequenceRequest:
        """Queue `request` on its sequence and wait until it has run; raises what its run raised.
        Enqueues before its first await, so requests arriving in order are served in order."""
        if batch_size > 1:
            raise InvalidInput(f"inference request to model '{self.model}' must specify batch-size 1 due to "
                               "requirements of sequence batcher")
        corrid, start, end = self._sequence_fields(request.parameters)
        sequence = self._sequences.get(corrid)
        if sequence is None and not start:
            raise InvalidInput(f"inference request for sequence {corrid} to model '{self.model}' must specify the "
                               "START flag on the first request of the sequence")
        if sequence is None:
            sequence = self._sequences[corrid] = Sequence(corrid)
            self._table.assign(sequence)
            self._reaper_wakeup.set()
        elif start:
            log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                        "sequence start. Previous sequence will be terminated early.", corrid, self.model)
        if end:  # a later START with this id begins a new sequence (in another slot if need be)
            del self._sequences[corrid]
        pending = SequenceRequest(request, sequence, start, end, enqueue_ns,
                                  asyncio.get_running_loop().create_future())
        sequence.num_busy += 1
        sequence.last_ns = enqueue_ns
        if sequence.slot is not None:
            sequence.slot.queue.append(pending)
            self._wakeups[sequence.slot.instance_index].set()
        else:
            sequence.backlog.append(pending)
        self._stats.pending += 1
        try:
            await pending.future
        except asyncio.CancelledError:
            self._discard(pending)  # the caller went away: never run it
            raise
        finally:
            if not pending.started:
                self._stats.pending -= 1
        return pending

    def _sequence_fields(self, params: dict) -> tuple[int | str, bool, bool]:
        corrid = params.get("sequence_id", 0)
        if type(corrid) not in (int, str) or (type(corrid) is int and not 0 <= corrid < 2**64):
            raise InvalidInput(f"request parameter 'sequence_id' must be an unsigned 64-bit integer or a string, "
                               f"got {corrid!r}", param="sequence_id")
        if corrid in (0, ""):
            raise InvalidInput(f"inference request to model '{self.model}' must specify a non-zero or non-empty "
                               "correlation ID")
        if isinstance(corrid, str) and len(corrid.encode()) > MAX_STRING_ID_BYTES:
            raise InvalidInput(f"request parameter 'sequence_id' is longer than {MAX_STRING_ID_BYTES} bytes",
                               param="sequence_id")
        self._check_corrid_type(corrid)
        return corrid, _flag(params, "sequence_start"), _flag(params, "sequence_end")

    def _check_corrid_type(self, corrid: int | str) -> None:
        """The model's CORRID control fixes the kind of id it can receive."""
        kind = self.settings.corrid_type
        if kind is None:
            return
        if kind == "TYPE_STRING" and not isinstance(corrid, str):
            raise InvalidInput(f"model '{self.model}' takes string sequence IDs (its CORRID control is TYPE_STRING), "
                               f"got the integer {corrid}", param="sequence_id")
        if kind != "TYPE_STRING":
            low, high = _CORRID_RANGES[kind]
            if isinstance(corrid, str) or not low <= corrid <= high:
                raise InvalidInput(f"model '{self.model}' takes integer sequence IDs that fit {kind} (its CORRID "
                                   f"control), got {corrid!r}", param="sequence_id")

    def _discard(self, pending: SequenceRequest) -> None:
        sequence = pending.sequence
        for queue in (sequence.backlog, sequence.slot.queue if sequence.slot else ()):
            if pending in queue:
                queue.remove(pending)
                sequence.num_busy -= 1
        if not sequence.backlog:
            self._table.drop_backlogged(sequence)

    # ---- one task per instance ----------------------------------------------------------
    async def _serve(self, index: int) -> None:
        wakeup, slots = self._wakeups[index], self._table.slots[index]
        while True:
            batch = self._oldest_batch(slots) if self.settings.is_oldest else self._direct_batch(slots)
            wait_ns = self._wait_ns(batch)
            if not batch or wait_ns > 0:
                # Nothing queued, or `oldest` waiting for its batch to fill: an arrival or the delay wakes it.
                wakeup.clear()
                try:
                    await asyncio.wait_for(wakeup.wait(), wait_ns / 1e9 if batch else None)
                except TimeoutError:
                    pass
                continue
            for slot, pending in batch:
                if pending is not None:
                    slot.queue.popleft()
            await self._execute(self._instances[index], batch)

    def _direct_batch(self, slots: list[Slot]) -> list[tuple[Slot, SequenceRequest | None]]:
        """Slots 0 .. the highest with a request queued; None: a padding row."""
        top = max((s.index for s in slots if s.queue), default=-1)
        return [(s, s.queue[0] if s.queue else None) for s in slots[:top + 1]]

    def _oldest_batch(self, slots: list[Slot]) -> list[tuple[Slot, SequenceRequest | None]]:
        heads = sorted((s for s in slots if s.queue), key=lambda s: s.queue[0].enqueue_ns)
        return [(s, s.queue[0]) for s in heads[:self.settings.max_batch_size]]

    def _wait_ns(self, batch: list) -> int:
        """How much longer `oldest` waits for its batch to fill (0: run now); `direct` never waits."""
        settings = self.settings
        if not settings.is_oldest or not settings.delay_ns or not batch:
            return 0
        if len(batch) >= settings.max_batch_size or len(batch) in settings.preferred_sizes:
            return 0
        return batch[0][1].enqueue_ns + settings.delay_ns - _now()

    async def _execute(self, instance, batch: list[tuple[Slot, SequenceRequest | None]]) -> None:
        start_ns = _now()
        real = [p for _, p in batch if p is not None]
        for pending in real:
            pending.queue_ns, pending.started = start_ns - pending.enqueue_ns, True
        self._stats.pending -= len(real)
        template = real[0].request
        requests = [prepare_request(self.settings, p.request if p else template, p, self._output_names)
                    for _, p in batch]
        try:
            results = await self._call(instance, requests)
        except Exception as e:
            results = [self._as_error(e)] * len(batch)
        infer_ns = _now() - start_ns
        self._stats.record_execution(len(batch), 0, infer_ns, 0)
        for (slot, pending), result in zip(batch, results):
            if pending is None:
                continue
            if not isinstance(result, BaseException):
                result = take_states(self.settings, pending, result)
            pending.infer_ns, pending.batch_total = infer_ns, len(batch)
            self._finish(slot, pending, result)

    async def _call(self, instance, requests: list[InferRequest]) -> list:
        shapes = {tuple((t.name, tuple(t.shape[1:])) for t in r.inputs) for r in requests}
        if self.merges_batches and len(requests) > 1 and len(shapes) == 1:
            results = await instance.execute([merge_requests(requests)])
            if isinstance(results[0], BaseException):
                raise results[0]
            return split_response(results[0], requests)
        results = await instance.execute(requests)
        if len(results) != len(requests):
            raise InternalError(f"model '{self.model}' returned {len(results)} responses for {len(requests)} requests")
        return [self._as_error(r) if isinstance(r, BaseException) else r for r in results]

    def _finish(self, slot: Slot, pending: SequenceRequest, result) -> None:
        sequence = pending.sequence
        sequence.num_busy -= 1
        sequence.last_ns = _now()
        if pending.end:
            self._release(slot, sequence)
        if isinstance(result, BaseException):
            _settle(pending, result)
        elif not pending.future.done():
            pending.future.set_result(result)

    def _release(self, slot: Slot, sequence: Sequence) -> None:
        taken = self._table.release(slot, sequence)
        if taken is not None:
            self._wakeups[taken.instance_index].set()

    # ---- idle sequences -----------------------------------------------------------------
    async def _reap(self) -> None:
        """Release sequences idle (nothing queued or running) for longer than max_sequence_idle."""
        idle_ns = self.settings.idle_ns
        while True:
            now = _now()
            deadline = None
            for corrid, sequence in list(self._sequences.items()):
                if sequence.num_busy:
                    continue
                if now - sequence.last_ns >= idle_ns:
                    log.info("model '%s': sequence %s was idle for more than %d us; released", self.model,
                             corrid, idle_ns // 1000)
                    del self._sequences[corrid]
                    if sequence.slot is not None:
                        self._release(sequence.slot, sequence)
                else:
                    deadline = min(deadline or now + idle_ns, sequence.last_ns + idle_ns)
            self._reaper_wakeup.clear()
            # Busy sequences are looked at again at least every idle period.
            timeout = ((deadline or now + idle_ns) - now) / 1e9
            try:
                await asyncio.wait_for(self._reaper_wakeup.wait(), max(timeout, 0.001))
            except TimeoutError:
                pass

    def _as_error(self, error: BaseException) -> ModelplexError:
        if isinstance(error, ModelplexError):
            return error
        log.error("model %s failed", self.model, exc_info=error)
        return InternalError(f"model '{self.model}' failed: {error}")


def _flag(params: dict, name: str) -> bool:
    """A JSON / gRPC bool, as Triton reads it (the Python backend's flags() trusts it as such)."""
    value = params.get(name, False)
    if type(value) is not bool:
        raise InvalidInput(f"request parameter '{name}' must be a boolean, got {value!r}", param=name)
    return value


def _settle(pending: SequenceRequest, error: BaseException) -> None:
    if not pending.future.done():
        pending.future.set_exception(error)
