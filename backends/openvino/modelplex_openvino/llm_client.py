"""The server's side of one LLM worker process (`llm_worker.py`): starts it, sends requests and adapter
changes, and hands each request's events to the coroutine streaming it.

A reader thread receives the worker's messages and passes them to the event loop. If the worker dies,
every open stream fails with the reason and the instance reports itself failed (the model turns
UNAVAILABLE until it is loaded again).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from multiprocessing.connection import Connection

from modelplex import InternalError, InvalidInput

log = logging.getLogger(__name__)
LOAD_TIMEOUT_SECONDS = 600
EXIT_TIMEOUT_SECONDS = 10


class LLMWorkerClient:
    """Invariant: `streams` holds a queue for every request sent and not yet ended; only the event loop
    touches it (the reader thread goes through `call_soon_threadsafe`)."""

    def __init__(self, settings: dict, model_name: str, report_failure: Callable[[str], None]):
        self.model_name, self.report_failure = model_name, report_failure
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, "-m", "modelplex_openvino.llm_worker", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()])
        theirs.close()
        self.conn = Connection(ours.detach())
        self.stats: dict = {}
        self.streams: dict[int, asyncio.Queue] = {}
        self.adapter_replies: dict[tuple[str, str], asyncio.Future] = {}
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._reader: threading.Thread | None = None
        self.conn.send(settings)
        self.info = self._wait_until_ready()
        self._reader = threading.Thread(target=self._read, name=f"openvino-llm-{model_name}", daemon=True)
        self._reader.start()

    def _wait_until_ready(self) -> dict:
        if not self.conn.poll(LOAD_TIMEOUT_SECONDS):
            self.close_now()
            raise InvalidInput(f"model '{self.model_name}': the OpenVINO GenAI pipeline did not load in "
                               f"{LOAD_TIMEOUT_SECONDS} s")
        try:
            kind, payload = self.conn.recv()
        except EOFError:
            kind, payload = "failed", f"its worker exited with code {self.proc.wait()}"
        if kind != "ready":
            self.close_now()
            raise InvalidInput(f"model '{self.model_name}': OpenVINO GenAI cannot load it: {payload}")
        return payload

    # ---- on the event loop ---------------------------------------------------------------
    async def generate(self, inputs: dict) -> AsyncIterator[dict]:
        """The request's deltas (dicts, see `Engine._delta`) until every completion finished; InvalidInput
        for a request the worker refuses. Leaving early cancels the request in the worker."""
        self._loop = asyncio.get_running_loop()
        request_id, queue = next(self._ids), asyncio.Queue()
        self.streams[request_id] = queue
        self.conn.send(("add", request_id, inputs))
        num_finished = 0
        try:
            while True:
                kind, payload = await queue.get()
                if kind == "error":
                    param, message = payload
                    raise InvalidInput(message, param=param)
                if kind == "died":
                    raise InternalError(payload)
                if kind == "cancelled":
                    return
                yield payload
                num_finished += payload["finish_reason"] is not None
                if num_finished == payload["num_sequences"]:
                    return
        finally:
            if self.streams.pop(request_id, None) is not None and not self._closing:
                self._send(("cancel", request_id))

    async def change_adapter(self, kind: str, name: str, *args) -> str | None:
        """`load_adapter` / `unload_adapter` in the worker; the reason when it failed."""
        self._loop = asyncio.get_running_loop()
        future = self._loop.create_future()
        self.adapter_replies[(kind, name)] = future
        self._send((kind, name, *args))
        return await future

    def _send(self, message: tuple) -> None:
        try:
            self.conn.send(message)
        except OSError:
            pass  # the worker is gone; the reader thread reports it

    def _dispatch(self, message: tuple) -> None:
        kind = message[0]
        if kind == "events":
            self.stats = message[2]
            for request_id, event, payload in message[1]:
                queue = self.streams.get(request_id)
                if queue is not None:
                    queue.put_nowait((event, payload))
        elif kind in ("adapter_loaded", "adapter_unloaded"):
            reply = "load_adapter" if kind == "adapter_loaded" else "unload_adapter"
            future = self.adapter_replies.pop((reply, message[1]), None)
            if future is not None and not future.done():
                future.set_result(message[2] if len(message) > 2 else None)

    def _died(self, reason: str) -> None:
        for queue in self.streams.values():
            queue.put_nowait(("died", reason))
        for future in self.adapter_replies.values():
            if not future.done():
                future.set_exception(InternalError(reason))
        self.adapter_replies.clear()

    # ---- on the reader thread ----------------------------------------------------------
    def _read(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "events" and not message[1]:
                self.stats = message[2]  # occupancy only: no need to wake the event loop
            elif self._loop is not None:
                self._loop.call_soon_threadsafe(self._dispatch, message)
        self.conn.close()
        if self._closing:
            return
        code = self.proc.wait()
        reason = f"model '{self.model_name}': its OpenVINO GenAI worker exited with code {code}"
        log.error("%s", reason)
        self.report_failure(reason)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._died, reason)

    def close_now(self) -> None:
        """Stop the worker (it exits when its socket closes) and wait for it."""
        self._closing = True
        if self._reader is None:
            self.conn.close()
        else:  # shut down, not closed, under the reader's recv (which a close fails with a TypeError): it closes it
            try:
                with socket.socket(fileno=os.dup(self.conn.fileno())) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # the reader has closed it already: the worker is gone
                pass
        try:
            self.proc.wait(EXIT_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
