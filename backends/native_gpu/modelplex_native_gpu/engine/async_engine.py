"""AsyncLLMEngine: runs the LLMEngine loop in a background thread; each request gets an async stream.

The event loop never waits for the engine: `generate` and `abort` only put the request (or its id)
in an inbox and wake the thread, which drains the inbox between steps. So an abort frees the
request's KV blocks within one engine step, and an add starts at the next step. A request the
engine refuses (bad input) fails its stream with the typed error before any output. Outputs cross
to the caller's event loop with call_soon_threadsafe. Leaving a stream early aborts the request.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ..config import EngineConfig
from ..errors import EngineError, InvalidRequestError
from .llm_engine import LLMEngine
from .outputs import RequestOutput
from .sampling_params import SamplingParams

logger = logging.getLogger(__name__)


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

    def __init__(self, engine: LLMEngine):
        self.engine = engine
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
            raise RuntimeError("engine is not running") from self._error

    def abort(self, request_id: str) -> None:
        """Stop delivering at once; the engine frees the request's blocks before its next step."""
        if self._streams.pop(request_id, None) is not None:
            self._aborts.append(request_id)
            self._wakeup.set()

    def shutdown(self) -> None:
        self._stopped = True
        self._wakeup.set()
        self._thread.join()

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
        for request_id in list(self._streams):
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, exc)
