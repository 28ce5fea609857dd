"""Dynamic batching: a model's requests wait in priority queues and run several per `execute` call.

Queues follow Triton's `dynamic_batching` policies (queue size limits, timeouts that reject or
delay, per-request `priority` and `timeout` parameters). One scheduler task per model version
takes an idle instance, forms a batch of requests whose non-batch shapes match, and runs it in a
task of its own, so N idle instances run N batches at once.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field

from ..core.errors import InternalError, InvalidInput, ModelplexError, Unavailable
from ..core.tensors import InferRequest
from ..observability.stats import ModelStats
from .batch_merge import merge_requests, split_response

log = logging.getLogger(__name__)
_now = time.perf_counter_ns

REJECT, DELAY = 0, 1  # ModelQueuePolicy.TimeoutAction values


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """One priority level's `ModelQueuePolicy`; timeouts in ns, 0 meaning none."""

    timeout_action: int = REJECT
    default_timeout_ns: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    @classmethod
    def from_config(cls, policy) -> QueuePolicy:
        return cls(policy.timeout_action, policy.default_timeout_microseconds * 1000,
                   policy.allow_timeout_override, policy.max_queue_size)

    def timeout_ns(self, requested_us: int) -> int:
        """Triton's rule: a request may shorten the default timeout, never lengthen it."""
        if self.allow_timeout_override and requested_us > 0:
            requested_ns = requested_us * 1000
            if not self.default_timeout_ns or requested_ns < self.default_timeout_ns:
                return requested_ns
        return self.default_timeout_ns


@dataclass(eq=False, slots=True)
class PendingRequest:
    """A request from admission to its response; `queue_ns`/`infer_ns` are filled when it runs."""

    request: InferRequest
    batch_size: int
    shape_key: tuple
    enqueue_ns: int
    future: asyncio.Future
    level: _Level
    timer: asyncio.TimerHandle | None = None
    queue_ns: int = 0
    infer_ns: int = 0
    batch_total: int = 0  # inferences in the batch it ran in (for its trace)
    started: bool = False  # its batch began executing (it no longer counts as pending)


@dataclass(slots=True)
class _Level:
    policy: QueuePolicy
    queue: collections.deque = field(default_factory=collections.deque)
    delayed: collections.deque = field(default_factory=collections.deque)  # timed out under DELAY

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


class DynamicBatcher:
    """Invariant: a queued request is in exactly one deque of one level until it is dispatched,
    expires (REJECT), or its caller goes away; `_num_queued` counts them."""

    def __init__(self, config, idle: asyncio.Queue, stats: ModelStats, merges_batches: bool = False):
        batching = config.dynamic_batching
        self.merges_batches = merges_batches
        self.model = config.name
        self.max_batch_size = max(1, config.max_batch_size)
        self.preferred_sizes = sorted({s for s in batching.preferred_batch_size if 0 < s <= self.max_batch_size})
        self.delay_ns = batching.max_queue_delay_microseconds * 1000
        self.num_levels = batching.priority_levels
        self.default_level = batching.default_priority_level
        if self.num_levels and not 1 <= self.default_level <= self.num_levels:
            raise InvalidInput(f"model '{self.model}': default_priority_level {self.default_level} must be "
                               f"between 1 and priority_levels {self.num_levels}")
        default = QueuePolicy.from_config(batching.default_queue_policy)
        overrides = {level: QueuePolicy.from_config(p) for level, p in batching.priority_queue_policy.items()}
        self.levels = {level: _Level(overrides.get(level, default))
                       for level in (range(1, self.num_levels + 1) if self.num_levels else [0])}
        self._idle, self._stats = idle, stats
        self._num_queued = 0
        self._wakeup = asyncio.Event()
        self._scheduler: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()
        self._exec_ns_estimate = 1_000_000  # recent batch run time, for the retry_after hint
        self.num_instances = 1

    def start(self, num_instances: int) -> None:
        self.num_instances = max(1, num_instances)
        self._scheduler = asyncio.create_task(self._schedule(), name=f"batcher-{self.model}")

    def close(self) -> None:
        """Stop scheduling and fail whatever is still queued (the model is going away)."""
        if self._scheduler is not None:
            self._scheduler.cancel()
        self._fail_queued(Unavailable(f"model '{self.model}' is unloading"))

    def _fail_queued(self, error: Exception) -> None:
        for level in self.levels.values():
            for pending in (*level.queue, *level.delayed):
                self._fail(pending, error)
            level.queue.clear()
            level.delayed.clear()
        self._num_queued = 0

    # ---- admission ----------------------------------------------------------------------
    async def run(self, request: InferRequest, batch_size: int, enqueue_ns: int) -> PendingRequest:
        """Queue `request` and wait until a batch carrying it has run; raises what its run raised."""
        pending = self._enqueue(request, batch_size, enqueue_ns)
        self._stats.pending += 1  # Triton's pending count: queued, not yet executing
        try:
            await pending.future
        except asyncio.CancelledError:
            self._discard(pending)  # the caller went away: never run it
            raise
        finally:
            if not pending.started:  # rejected, timed out or cancelled while queued
                self._stats.pending -= 1
        return pending

    def _enqueue(self, request: InferRequest, batch_size: int, enqueue_ns: int) -> PendingRequest:
        params = request.parameters
        level = self.levels[self._level_of(params.get("priority", 0))]
        if level.policy.max_queue_size and len(level) >= level.policy.max_queue_size:
            raise Unavailable(f"model '{self.model}': request rejected, the queue holds its maximum of "
                              f"{level.policy.max_queue_size} requests", self._retry_after())
        loop = asyncio.get_running_loop()
        shape_key = tuple(sorted((t.name, t.datatype, tuple(t.shape[1:])) for t in request.inputs))
        pending = PendingRequest(request, batch_size, shape_key, enqueue_ns, loop.create_future(), level)
        timeout_ns = level.policy.timeout_ns(_microseconds(params.get("timeout", 0)))
        if timeout_ns:
            pending.timer = loop.call_later(timeout_ns / 1e9, self._expire, pending)
        level.queue.append(pending)
        self._num_queued += 1
        self._wakeup.set()
        return pending

    def _level_of(self, priority) -> int:
        if type(priority) is not int or priority < 0:
            raise InvalidInput(f"request parameter 'priority' must be a non-negative integer, got {priority!r}")
        if not self.num_levels:
            return 0
        # Triton: 0 or a level beyond priority_levels means the default level.
        return priority if 0 < priority <= self.num_levels else self.default_level

    def _expire(self, pending: PendingRequest) -> None:
        level = pending.level
        if pending not in level.queue:
            return
        level.queue.remove(pending)
        if level.policy.timeout_action == DELAY:
            level.delayed.append(pending)
            return
        self._num_queued -= 1
        self._fail(pending, Unavailable(f"model '{self.model}': request timeout expired after "
                                        f"{(_now() - pending.enqueue_ns) / 1e6:.1f} ms in the queue",
                                        self._retry_after()))

    def _discard(self, pending: PendingRequest) -> None:
        for queue in (pending.level.queue, pending.level.delayed):
            if pending in queue:
                queue.remove(pending)
                self._num_queued -= 1
        if pending.timer is not None:
            pending.timer.cancel()

    def _retry_after(self) -> float:
        batches_ahead = self._num_queued / self.max_batch_size + 1
        return max(0.001, self._exec_ns_estimate * batches_ahead / self.num_instances / 1e9)

    @staticmethod
    def _fail(pending: PendingRequest, error: Exception) -> None:
        if pending.timer is not None:
            pending.timer.cancel()
        if not pending.future.done():
            pending.future.set_exception(error)

    # ---- scheduling ---------------------------------------------------------------------
    async def _schedule(self) -> None:
        while True:
            if not self._num_queued:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            instance = await self._idle.get()
            try:
                batch = await self._next_batch()
            except Exception as e:
                log.exception("model %s: dynamic batcher failed", self.model)
                self._fail_queued(InternalError(f"model '{self.model}': dynamic batcher failed: {e}"))
                batch = []
            except BaseException:
                self._idle.put_nowait(instance)
                raise
            if not batch:  # everything queued expired or was cancelled while we waited
                self._idle.put_nowait(instance)
                continue
            task = asyncio.create_task(self._run_batch(instance, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _next_batch(self) -> list[PendingRequest]:
        """The next batch to run, waiting up to max_queue_delay for it to fill (or hit a preferred size)."""
        while True:
            batch, is_ready = self._peek()
            if not batch:
                return batch
            wait_ns = min(p.enqueue_ns for p in batch) + self.delay_ns - _now()
            if is_ready or wait_ns <= 0:
                break
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), wait_ns / 1e9)
            except TimeoutError:
                pass
        for pending in batch:
            self._discard(pending)
        return batch

    def _peek(self) -> tuple[list[PendingRequest], bool]:
        """Requests in priority order (a level's delayed ones last) that share the first one's
        non-batch shapes and fit max_batch_size together; and whether the batch should run now."""
        batch: list[PendingRequest] = []
        total = preferred_cut = 0
        shape_key = None
        for level in self.levels.values():
            for queue in (level.queue, level.delayed):
                for pending in queue:
                    if shape_key is None:
                        shape_key = pending.shape_key
                    elif pending.shape_key != shape_key:
                        continue
                    if total + pending.batch_size > self.max_batch_size:
                        return self._cut(batch, preferred_cut), True  # full: cannot grow
                    batch.append(pending)
                    total += pending.batch_size
                    if total in self.preferred_sizes:
                        preferred_cut = len(batch)
                    if total == self.max_batch_size:
                        return batch, True
        if preferred_cut:
            return batch[:preferred_cut], True
        return batch, not self.delay_ns

    @staticmethod
    def _cut(batch: list[PendingRequest], preferred_cut: int) -> list[PendingRequest]:
        return batch[:preferred_cut] if preferred_cut else batch

    async def _run_batch(self, instance, batch: list[PendingRequest]) -> None:
        start = _now()
        for pending in batch:
            pending.queue_ns = start - pending.enqueue_ns
            pending.started = True
        self._stats.pending -= len(batch)
        try:
            await self._execute(instance, batch)
        finally:
            self._idle.put_nowait(instance)

    async def _execute(self, instance, batch: list[PendingRequest]) -> None:
        start = _now()
        requests = [p.request for p in batch]
        try:
            if self.merges_batches and len(batch) > 1:
                results = await self._execute_merged(instance, requests)
            else:
                results = await instance.execute(requests)
                if len(results) != len(batch):
                    raise InternalError(f"model '{self.model}' returned {len(results)} responses "
                                        f"for {len(batch)} requests")
        except Exception as e:
            error = self._as_error(e)
            for pending in batch:
                self._fail(pending, error)
            return
        infer_ns = _now() - start
        self._exec_ns_estimate = infer_ns
        total = sum(p.batch_size for p in batch)
        self._stats.record_execution(total, 0, infer_ns, 0)
        for pending, result in zip(batch, results):
            if isinstance(result, BaseException):
                self._fail(pending, self._as_error(result))
                continue
            pending.infer_ns, pending.batch_total = infer_ns, total
            if not pending.future.done():
                pending.future.set_result(result)

    async def _execute_merged(self, instance, requests: list[InferRequest]) -> list:
        """One backend call over the requests' rows; split back per request."""
        try:
            results = await instance.execute([merge_requests(requests)])
            if len(results) != 1:
                raise InternalError(f"model '{self.model}' returned {len(results)} responses for 1 request")
            if isinstance(results[0], BaseException):
                raise results[0]
        except InvalidInput:
            # Bad data in one request (a token id out of range) fails the merged run: only running each
            # alone tells whose it was, so its batch mates still get answers. Only on this error path.
            return [await self._execute_alone(instance, r) for r in requests]
        return split_response(results[0], requests)

    async def _execute_alone(self, instance, request: InferRequest):
        try:
            (result,) = await instance.execute([request])
        except Exception as e:
            return e
        return result

    def _as_error(self, error: BaseException) -> ModelplexError:
        if isinstance(error, ModelplexError):
            return error
        log.error("model %s failed", self.model, exc_info=error)
        return InternalError(f"model '{self.model}' failed: {error}")


def _microseconds(value) -> int:
    if type(value) is not int or value < 0:
        raise InvalidInput(f"request parameter 'timeout' must be a non-negative integer (microseconds), "
                           f"got {value!r}")
    return value
