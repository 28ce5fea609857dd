"""EngineProcessClient: the server's side of an engine process (core_proc.py), with AsyncLLMEngine's interface.

The engine runs in a child process (multiprocessing's spawn context) with a GIL of its own, so HTTP, JSON
and tokenization in the server no longer share one with the engine loop. The server keeps its own
tokenizer (prompts are tokenized here, on worker threads); detokenization stays in the engine process,
which sends text deltas with the token ids. Commands leave through a writer thread, every waiting one in
one write, so the event loop never blocks on a full pipe; a reader thread receives one message per
engine step and hands it to the event loop with one `call_soon_threadsafe`. When the process dies, every
stream and call fails with EngineDeadError and `on_failure` hears why (the host then marks the model
UNAVAILABLE until it is loaded again).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import multiprocessing
import queue
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from ..config import EngineConfig
from ..errors import EngineDeadError, InvalidRequestError, ModelLoadError
from .core_proc import run_engine_core
from .outputs import RequestOutput
from .sampling_params import SamplingParams
from .wire import Totals

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 3.0  # for the process to leave once told to stop (it does between two steps); then killed


@dataclass
class _Stream:
    request_id: str
    queue: asyncio.Queue
    num_open: int  # completions (n) not finished yet
    totals: Totals = field(default_factory=Totals)


class EngineProcessClient:
    """Invariant: `_streams` holds a stream from its `generate` until it finishes, fails or is left, and
    `_replies` a future per call not answered yet; both are touched on the event loop only (the reader
    thread goes through `call_soon_threadsafe`). After `_dead` is set nothing new is accepted."""

    def __init__(self, config: EngineConfig, on_progress: Callable[[str], None] | None = None,
                 on_failure: Callable[[str], None] | None = None, cancel=None):
        """Start the process and wait until its engine is ready; `cancel` (the host's LoadCancel) kills
        it when the host gives up on the load."""
        self._on_failure = on_failure or (lambda reason: None)
        context = multiprocessing.get_context("spawn")
        self._conn, theirs = context.Pipe()
        started = time.monotonic()
        self.proc = context.Process(target=run_engine_core, args=(config, theirs, started), name="llm-engine",
                                    daemon=True)
        self.proc.start()
        theirs.close()
        forget = cancel.on_cancel(self.proc.kill) if cancel is not None else (lambda: None)
        try:
            tokenizer_error = None
            try:  # while the process loads the weights
                from ..loader.tokenizer import load_tokenizer

                self.tokenizer = None if config.skip_tokenizer_init else load_tokenizer(config.model)
            except Exception as exc:
                tokenizer_error = exc
            info = self._wait_until_ready(on_progress or (lambda message: None))
            if tokenizer_error is not None:
                raise tokenizer_error
        except BaseException:
            self.proc.kill()
            self.proc.join()
            raise
        finally:
            forget()
        self.pid: int = info["pid"]
        self.max_model_len: int = info["max_model_len"]
        self.vocab_size: int = info["vocab_size"]
        self.has_lora: bool = info["has_lora"]
        self._stats: dict = info["stats"]
        log.info("engine process %d ready in %.1f s (spawn and interpreter start %.2f s)", self.pid,
                 time.monotonic() - started, info["spawn_seconds"])
        self._streams: dict[str, _Stream] = {}
        self._keys: dict[str, str] = {}  # request id -> the key the engine process knows it by
        self._next_key = itertools.count()
        self._replies: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._num_adds = 0
        self._unacked_adds: collections.deque[tuple[int, int]] = collections.deque()  # (add number, n)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dead: str | None = None
        self._closing = False
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._write, name="llm-engine-writer", daemon=True).start()
        threading.Thread(target=self._read, name="llm-engine-reader", daemon=True).start()

    def _wait_until_ready(self, on_progress: Callable[[str], None]) -> dict:
        while True:
            try:
                kind, payload = self._conn.recv()
            except (EOFError, OSError):
                self.proc.join(STOP_TIMEOUT_S)
                raise ModelLoadError(f"the engine process {_exit_reason(self.proc.exitcode)} while loading") from None
            if kind == "progress":
                on_progress(payload)
            elif kind == "failed":
                raise payload
            else:
                return payload

    # ------------------------------------------------------------------ the engine's surface

    @property
    def num_waiting(self) -> int:
        """Completions not yet running: in the engine's queue, or sent and not yet taken by it."""
        return self._stats["num_waiting"] + sum(n for _, n in self._unacked_adds)

    def stats(self) -> dict:
        """The engine's stats as of its last step (they come with every step), plus its pid."""
        return {**self._stats, "num_waiting": self.num_waiting, "engine_pid": self.pid}

    async def generate(self, request_id: str, prompt: str | list[int],
                       sampling_params: SamplingParams | dict | None = None,
                       *, priority: int = 0, cache_salt=None,
                       lora: str | None = None) -> AsyncIterator[RequestOutput]:
        """Yield incremental outputs until every completion of the request has finished."""
        if isinstance(sampling_params, dict):
            sampling_params = SamplingParams.from_dict(sampling_params)
        params = sampling_params or SamplingParams()
        self._loop = asyncio.get_running_loop()
        self._check_running()
        if request_id in self._keys:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        key = str(next(self._next_key))
        stream = self._streams[key] = _Stream(request_id, asyncio.Queue(), params.n)
        self._keys[request_id] = key
        self._num_adds += 1
        self._unacked_adds.append((self._num_adds, params.n))
        self._post(("add", key, prompt, params, priority, cache_salt, lora))
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True  # the engine has dropped the request (or is gone)
                    raise item
                yield item
                if item.finished:
                    stream.num_open -= 1
                    finished = stream.num_open == 0
        finally:
            self._streams.pop(key, None)
            self._keys.pop(request_id, None)
            if not finished:
                self._post(("abort", key))

    def abort(self, request_id: str) -> None:
        """Stop delivering at once; the engine frees the request's blocks before its next step."""
        key = self._keys.pop(request_id, None)
        if key is not None and self._streams.pop(key, None) is not None:
            self._post(("abort", key))

    async def compile_constraint(self, constraint: dict, field_name: str) -> None:
        """Compile (or refuse, naming `field_name`) a structured-output constraint in the engine's cache."""
        await self._call("compile", constraint, field_name)

    async def lora_register(self, name: str, path) -> None:
        await self._call("lora_register", name, path)

    async def lora_prefetch(self, name: str) -> None:
        """Bring an adapter back into host memory before its request, unless it is there already."""
        row = next((r for r in self.lora_rows() if r["name"] == name), None)
        if row is None or not row["in_host_memory"]:
            await self._call("lora_prefetch", name)

    async def lora_unload(self, name: str) -> None:
        """Refuse new requests for `name` now; returns once its requests in flight have finished."""
        await self._call("lora_unload", name)

    def lora_rows(self) -> list[dict]:
        lora = self._stats.get("lora")
        return [] if lora is None else lora["adapters"]

    async def close(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the process (between two steps); kill it if it has not left within `timeout`. Never blocks
        the event loop; cancelled, it kills the process at once."""
        self._closing = True
        self._post(("stop",))
        self._outbox.put(None)
        try:
            await asyncio.to_thread(self.proc.join, timeout)
            if self.proc.exitcode is None:
                log.warning("engine process %d did not stop within %.0f s; killed", self.pid, timeout)
                self.proc.kill()
                await asyncio.to_thread(self.proc.join, timeout)
        finally:
            if self.proc.exitcode is None:  # cancelled meanwhile
                self.proc.kill()
            self._fail_all("the engine was shut down")

    # ------------------------------------------------------------------ on the event loop

    def _check_running(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(self._dead)

    def _post(self, command: tuple) -> None:
        self._outbox.put(command)

    async def _call(self, name: str, *args) -> None:
        self._loop = asyncio.get_running_loop()
        self._check_running()
        call_id = next(self._call_ids)
        future = self._replies[call_id] = self._loop.create_future()
        self._post(("call", call_id, name, args))
        try:
            await future
        finally:
            self._replies.pop(call_id, None)

    def _dispatch(self, message: tuple) -> None:
        kind = message[0]
        if kind == "step":
            _, outputs, errors, stats = message
            for fields in outputs:
                stream = self._streams.get(fields[0])
                if stream is not None:  # else left or aborted meanwhile
                    stream.queue.put_nowait(stream.totals.unpack(stream.request_id, fields))
            for key, error in errors:
                stream = self._streams.get(key)
                if stream is not None:
                    stream.queue.put_nowait(error)
        else:  # a call's reply
            _, call_id, error, stats = message
            future = self._replies.get(call_id)
            if future is not None and not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
        self._set_stats(stats)

    def _set_stats(self, stats: dict) -> None:
        while self._unacked_adds and self._unacked_adds[0][0] <= stats["num_adds"]:
            self._unacked_adds.popleft()
        self._stats = stats

    def _fail_all(self, reason: str) -> None:
        self._dead = self._dead or reason
        error = EngineDeadError(reason)
        for stream in self._streams.values():
            stream.queue.put_nowait(error)
        for future in self._replies.values():
            if not future.done():
                future.set_exception(error)

    # ------------------------------------------------------------------ the pipe's threads

    def _write(self) -> None:
        while True:
            batch = [self._outbox.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self._outbox.get_nowait())
            last = None in batch
            batch = batch[:batch.index(None)] if last else batch
            try:
                if batch:
                    self._conn.send(batch)
            except (OSError, ValueError):
                return  # the process is gone: the reader reports it
            if last:
                return

    def _read(self) -> None:
        fatal = None
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "fatal":
                fatal = message[1]
            elif self._loop is not None:
                self._loop.call_soon_threadsafe(self._dispatch, message)
            else:  # nothing asked yet: only the stats matter
                self._stats = message[-1]
        self._conn.close()
        if self._closing:
            return
        self.proc.join(STOP_TIMEOUT_S)
        reason = f"the engine process {self.pid} {_exit_reason(self.proc.exitcode)}" + (f": {fatal}" if fatal else "")
        log.error("%s", reason)
        # The reason first, the loop second: `generate` sets the loop first and checks the reason second,
        # so a request is either refused there or failed by `_fail_all`.
        self._dead = reason
        self._on_failure(reason)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._fail_all, reason)


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"
