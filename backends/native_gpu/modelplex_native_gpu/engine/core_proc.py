"""The engine process: an LLMEngine loop serving one EngineProcessClient (core_client.py) over a pipe.

Between steps it takes every command waiting (adds, aborts, calls) without blocking; with nothing to run
it sleeps on the pipe. Each step's outputs (token ids, text deltas: detokenization happens here) go back
in one message with the engine's stats. Calls that can take a while (compiling a grammar, reading an
adapter from disk) run on a helper thread so steps go on. It exits when told to stop or when the pipe
closes (the server is gone); a step that raises is reported ("fatal") and ends the process.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

from ..config import EngineConfig
from .wire import pack, portable

log = logging.getLogger(__name__)
UNLOAD_POLL_S = 0.01  # while an adapter unload waits for its last requests with nothing else to do


def run_engine_core(config: EngineConfig, conn: Connection, spawned_at: float) -> None:
    """The process's entry point (multiprocessing spawn target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server drains, then stops us
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s engine[%(process)d] %(name)s: "
                                                      "%(message)s")
    started = time.monotonic()
    try:
        from .llm_engine import LLMEngine
        from .structured_output import preload

        preload()
        engine = LLMEngine(config, on_progress=lambda message: conn.send(("progress", message)))
    except BaseException as exc:  # whatever stops the load is the load's error
        conn.send(("failed", portable(exc)))
        return
    core = EngineCore(engine, conn)
    conn.send(("ready", {"pid": os.getpid(), "max_model_len": engine.max_model_len, "vocab_size": engine.vocab_size,
                         "block_size": config.block_size, "has_lora": engine.lora is not None,
                         "spawn_seconds": started - spawned_at, "stats": core.stats()}))
    code = 0
    try:
        core.run()
    except BaseException as exc:
        log.exception("engine step failed")
        core.send(("fatal", f"engine step failed: {exc!r}"))
        code = 1
    # Nothing to tear down but memory: leave now (an interpreter's finalization with torch loaded took
    # over 3 s on a busy 2-core machine).
    logging.shutdown()
    os._exit(code)


class EngineCore:
    """Invariant: the loop thread alone adds, aborts and steps; the helper thread only compiles grammars
    and reads adapters (both safe beside a step). Sends from either go through `send` (one lock)."""

    def __init__(self, engine, conn: Connection):
        self.engine, self.conn = engine, conn
        self._send_lock = threading.Lock()
        self._helper = ThreadPoolExecutor(1, thread_name_prefix="engine-calls")
        self._unloads: list[tuple[int, object]] = []  # (call id, adapter) waiting for their requests to end
        self._errors: list[tuple[str, BaseException]] = []  # adds refused since the last message
        self._num_adds = 0  # adds taken so far: the server counts later ones as waiting
        self._stopping = False

    def send(self, message: tuple) -> None:
        with self._send_lock:
            self.conn.send(message)

    def stats(self) -> dict:
        return {**self.engine.stats(), "num_adds": self._num_adds}

    def run(self) -> None:
        engine = self.engine
        while not self._stopping:
            busy = engine.has_unfinished_requests()
            changed = self._receive(0 if busy else UNLOAD_POLL_S if self._unloads else None)
            if self._stopping:
                break
            self._finish_unloads()
            if engine.has_unfinished_requests():
                outputs = engine.step()
                self.send(("step", [pack(o) for o in outputs], self._take_errors(), self.stats()))
            elif changed:
                self.send(("step", [], self._take_errors(), self.stats()))
        self._helper.shutdown(wait=False, cancel_futures=True)

    def _take_errors(self) -> list:
        errors, self._errors = self._errors, []
        return errors

    def _receive(self, timeout: float | None) -> bool:
        """Handle every command batch waiting (waiting up to `timeout` for the first); True if any came."""
        if not self.conn.poll(timeout):
            return False
        while True:
            try:
                batch = self.conn.recv()
            except (EOFError, OSError):  # the server is gone
                self._stopping = True
                return True
            for command in batch:
                self._handle(command)
            if self._stopping or not self.conn.poll(0):
                return True

    def _handle(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            _, key, prompt, params, priority, cache_salt, lora = command
            self._num_adds += 1
            try:
                self.engine.add_request(key, prompt, params, priority=priority, cache_salt=cache_salt, lora=lora)
            except Exception as exc:  # refused: this request's stream fails, the engine goes on
                if not hasattr(exc, "field"):
                    log.exception("add_request failed")
                self._errors.append((key, portable(exc)))
        elif kind == "abort":
            self.engine.abort(command[1])
        elif kind == "call":
            self._call(*command[1:])
        elif kind == "stop":
            self._stopping = True

    def _call(self, call_id: int, name: str, args: tuple) -> None:
        if name == "lora_unload":
            try:
                self._unloads.append((call_id, self.engine.lora.manager.begin_unload(*args)))
            except Exception as exc:
                self.send(("reply", call_id, portable(exc), self.stats()))
            return
        if name == "compile":
            function = self.engine.structured_outputs.compile
        else:
            manager = self.engine.lora.manager
            function = {"lora_register": manager.register, "lora_prefetch": manager.prefetch}[name]
        self._helper.submit(self._run_call, call_id, function, args)

    def _run_call(self, call_id: int, function, args: tuple) -> None:
        error = None
        try:
            function(*args)
        except Exception as exc:
            error = portable(exc)
        self.send(("reply", call_id, error, self.stats()))

    def _finish_unloads(self) -> None:
        for call_id, adapter in [u for u in self._unloads if not u[1].num_pins]:
            self._unloads.remove((call_id, adapter))
            self.engine.lora.manager.finish_unload(adapter)
            self.send(("reply", call_id, None, self.stats()))
