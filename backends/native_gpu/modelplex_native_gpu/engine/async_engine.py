"""AsyncLLMEngine: runs the LLMEngine loop in a background thread; each request gets an async stream.

The event loop never waits for the engine: `generate` and `abort` only put the request (or its id)
in an inbox and wake the thread, which drains the inbox between steps. So an abort frees the
request's KV blocks within one engine step, and an add starts at the next step. A request the
engine refuses (bad input) fails its stream with the typed error before any output. Outputs cross
to the caller's event loop with call_soon_threadsafe. Leaving a stream early aborts the request.
The in-process mode of the engine (`EngineConfig.engine_process` false; core_client.py is the other):
`close` never joins the thread on the event loop, and a thread stuck in a step is left behind (daemon).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ..config import EngineConfig
from ..errors import EngineDeadError, EngineError, InvalidRequestError
from .llm_engine import LLMEngine
from .outputs import RequestOutput
from .sampling_params import SamplingParams

logger = logging.getLogger(__name__)
STOP_TIMEOUT_S = 3.0  # for the thread to leave once told to stop (it does between two steps)
UNLOAD_POLL_S = 0.05


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    num_open: int  # completions (n) not finished yet


@dataclass
class _NewRequest:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    priority: int
    cache_salt: object
    lora: str | None = None


class AsyncLLMEngine:
    """Invariant: `_streams` holds a stream from its `generate` until it finishes or is aborted; the
    engine thread alone touches the LLMEngine, and adds a queued request only while its stream exists
    (so an abort that overtakes its own add leaves nothing running)."""

    def __init__(self, engine: LLMEngine, on_failure: Callable[[str], None] | None = None):
        self.engine = engine
        self._on_failure = on_failure or (lambda reason: None)
        self.max_model_len, self.vocab_size = engine.max_model_len, engine.vocab_size
        self.has_lora = engine.lora is not None
        self.pid = None  # the engine runs in this process
        self._streams: dict[str, _Stream] = {}
        self._new_requests: collections.deque[_NewRequest] = collections.deque()  # deques are thread-safe
        self._aborts: collections.deque[str] = collections.deque()
        self._wakeup = threading.Event()
        self._stopped = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="llm-engine-loop", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncLLMEngine:
        return cls(LLMEngine(config))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def num_waiting(self) -> int:
        """Completions not yet running: in the scheduler's queue or still in the inbox."""
        return len(self.engine.scheduler.waiting) + sum(r.params.n for r in list(self._new_requests))

    async def generate(self, request_id: str, prompt: str | list[int],
                       sampling_params: SamplingParams | dict | None = None,
                       *, priority: int = 0, cache_salt=None,
                       lora: str | None = None) -> AsyncIterator[RequestOutput]:
        """Yield incremental outputs until every completion of the request has finished."""
        stream = self._add(request_id, prompt, sampling_params, priority, cache_salt, lora)
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True  # the engine has already dropped the request
                    raise item
                yield item
                if item.finished:
                    stream.num_open -= 1
                    finished = stream.num_open == 0
        finally:
            if not finished:
                self.abort(request_id)

    def _add(self, request_id, prompt, sampling_params, priority, cache_salt, lora) -> _Stream:
        if isinstance(sampling_params, dict):
            sampling_params = SamplingParams.from_dict(sampling_params)
        params = sampling_params or SamplingParams()
        self._check_running()
        if request_id in self._streams:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), params.n)
        self._streams[request_id] = stream
        try:
            self._check_running()  # the engine failed meanwhile: nobody would deliver to this stream
        except RuntimeError:
            self._streams.pop(request_id, None)
            raise
        self._new_requests.append(_NewRequest(request_id, prompt, params, priority, cache_salt, lora))
        self._wakeup.set()
        return stream

    def _check_running(self) -> None:
        if self._error is not None or self._stopped:
            raise EngineDeadError("the engine is not running" + (f": {self._error!r}" if self._error else ""))

    def abort(self, request_id: str) -> None:
        """Stop delivering at once; the engine frees the request's blocks before its next step."""
        if self._streams.pop(request_id, None) is not None:
            self._aborts.append(request_id)
            self._wakeup.set()

    def stats(self) -> dict:
        return {**self.engine.stats(), "num_waiting": self.num_waiting}

    async def compile_constraint(self, constraint: dict, field_name: str) -> None:
        """Compile (or refuse, naming `field_name`) a structured-output constraint, off the event loop and
        the engine thread; the engine's add then finds the grammar in xgrammar's cache."""
        await asyncio.to_thread(self.engine.structured_outputs.compile, constraint, field_name)

    async def lora_register(self, name: str, path) -> None:
        await asyncio.to_thread(self.engine.lora.manager.register, name, path)

    async def lora_prefetch(self, name: str) -> None:
        """Bring an adapter back into host memory (a disk read, never on the engine loop)."""
        if not self.engine.lora.manager.is_cached(name):
            await asyncio.to_thread(self.engine.lora.manager.prefetch, name)

    async def lora_unload(self, name: str) -> None:
        """Refuse new requests for `name` now; returns once its requests in flight have finished."""
        manager = self.engine.lora.manager
        adapter = manager.begin_unload(name)
        while adapter.num_pins:
            await asyncio.sleep(UNLOAD_POLL_S)
        manager.finish_unload(adapter)

    def lora_rows(self) -> list[dict]:
        return [] if self.engine.lora is None else self.engine.lora.manager.rows()

    async def close(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the thread between two steps, waiting up to `timeout` off the event loop; a thread still in
        a step after that is left to finish it (a daemon: it does not hold the process's exit)."""
        self._stopped = True
        self._wakeup.set()
        await asyncio.to_thread(self._thread.join, timeout)
        if self._thread.is_alive():
            logger.warning("engine thread still in a step %.0f s after stop; leaving it", timeout)
        self._fail_streams(EngineDeadError("the engine was shut down"))

    def shutdown(self, timeout: float | None = None) -> None:
        """`close` for callers without an event loop (tests, benchmarks)."""
        self._stopped = True
        self._wakeup.set()
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the engine thread

    def _run(self):
        while not self._stopped:
            self._wakeup.clear()  # before draining: a request queued after the drain wakes the wait
            self._drain_inbox()
            if not self.engine.has_unfinished_requests():
                self._wakeup.wait()
                continue
            try:
                outputs = self.engine.step()
            except BaseException as exc:  # a broken step fails every stream instead of hanging them
                logger.exception("engine step failed")
                self._fail_all(exc)
                return
            self._deliver(outputs)

    def _drain_inbox(self):
        while self._new_requests:
            new = self._new_requests.popleft()
            stream = self._streams.get(new.request_id)
            if stream is None:  # aborted before it started
                continue
            try:
                self.engine.add_request(new.request_id, new.prompt, new.params, priority=new.priority,
                                        cache_salt=new.cache_salt, lora=new.lora)
            except EngineError as exc:
                self._streams.pop(new.request_id, None)
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, exc)
        while self._aborts:
            self.engine.abort(self._aborts.popleft())

    def _deliver(self, outputs: list[RequestOutput]):
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:  # else aborted during the step
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, output)
        for output in outputs:  # after delivering: n > 1 completions may finish in the same step
            if output.finished and not self.engine.is_active(output.request_id):
                self._streams.pop(output.request_id, None)

    def _fail_all(self, exc: BaseException):
        self._error = exc  # set first: an add racing with this sees it (see _add)
        self._on_failure(f"engine step failed: {exc!r}")
        self._fail_streams(exc)

    def _fail_streams(self, exc: BaseException):
        for request_id in list(self._streams):
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, exc)
