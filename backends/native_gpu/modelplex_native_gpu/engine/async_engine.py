"""AsyncLLMEngine: runs the LLMEngine loop in a background thread; each request gets an async stream.

A lock serialises the engine: add/abort from event-loop threads wait at most one step, and
their input errors are raised in the caller. Outputs cross to the caller's event loop with
call_soon_threadsafe. Leaving a stream early (break, cancellation) aborts the request.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ..config import EngineConfig
from .llm_engine import LLMEngine
from .outputs import RequestOutput
from .sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    num_open: int  # completions (n) not finished yet


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._streams: dict[str, _Stream] = {}
        self._stopped = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="llm-engine-loop", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> "AsyncLLMEngine":
        return cls(LLMEngine(config))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    async def generate(self, request_id: str, prompt: str | list[int], sampling_params: SamplingParams | dict | None = None,
                       *, priority: int = 0, cache_salt=None) -> AsyncIterator[RequestOutput]:
        """Yield incremental outputs until every completion of the request has finished."""
        stream = self._add(request_id, prompt, sampling_params, priority, cache_salt)
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    stream.num_open -= 1
                    finished = stream.num_open == 0
        finally:
            if not finished:
                self.abort(request_id)

    def _add(self, request_id, prompt, sampling_params, priority, cache_salt) -> _Stream:
        if isinstance(sampling_params, dict):
            sampling_params = SamplingParams.from_dict(sampling_params)
        params = sampling_params or SamplingParams()
        with self._wakeup:
            if self._error is not None or self._stopped:
                raise RuntimeError("engine is not running") from self._error
            self.engine.add_request(request_id, prompt, params, priority=priority, cache_salt=cache_salt)
            stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), params.n)
            self._streams[request_id] = stream
            self._wakeup.notify()
        return stream

    def abort(self, request_id: str) -> None:
        with self._lock:
            self.engine.abort(request_id)
            self._streams.pop(request_id, None)

    def shutdown(self) -> None:
        with self._wakeup:
            self._stopped = True
            self._wakeup.notify()
        self._thread.join()

    def _run(self):
        while True:
            with self._wakeup:
                while not self._stopped and not self.engine.has_unfinished_requests():
                    self._wakeup.wait()
                if self._stopped:
                    return
                try:
                    outputs = self.engine.step()
                except BaseException as exc:  # a broken step fails every stream instead of hanging them
                    logger.exception("engine step failed")
                    self._error = exc
                    for stream in self._streams.values():
                        stream.loop.call_soon_threadsafe(stream.queue.put_nowait, exc)
                    self._streams.clear()
                    return
                deliveries = [(self._streams.get(o.request_id), o) for o in outputs]
            for stream, output in deliveries:
                if stream is not None:
                    stream.loop.call_soon_threadsafe(stream.queue.put_nowait, output)
            self._forget_finished(outputs)

    def _forget_finished(self, outputs: list[RequestOutput]):
        with self._lock:
            for output in outputs:
                if output.finished and not self.engine.is_active(output.request_id):
                    self._streams.pop(output.request_id, None)
