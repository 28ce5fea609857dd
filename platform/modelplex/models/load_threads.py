"""Where a model load's steps run: each on a thread of its own, within the load's deadline.

Reading configs and model files, auto-completing and creating instances touch the disk and run plugin
or user code, so none of it may run on the event loop (a slow `auto_complete_config`, a FIFO named
config.pbtxt or a large ONNX file would stall health checks), nor on the shared default pool (a hung
load would hold one of its threads for good). A backend's first use in the process (its first
`auto_complete_config` and `create_instance` until one instance exists) runs alone, under that
backend's lock: lazily loaded packages (transformers, OpenVINO, xgrammar, compiled kernels) are not
safe to import from two threads at once, which made one of two LLMs starting together fail with
`ImportError: cannot import name 'AutoTokenizer'`. The lock is per backend, so a long first load of one
(an LLM compiling kernels, a Python model's slow initialize) never holds up another's.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ..core.backend import LoadCancel
from ..core.errors import Unavailable

T = TypeVar("T")
_warm_backends: set[str] = set()  # backends that created an instance in this process
_first_use_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()
_POLL_SECS = 0.2  # how often a thread waiting for the first-use lock checks whether its load was given up


class LoadTimeout(Unavailable):
    """A load step still running at the load's deadline (`--model-load-timeout-secs`)."""


def _settle(future: asyncio.Future, result, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


@contextlib.contextmanager
def _first_use(backend: str | None, warms: bool, given_up: threading.Event):
    """Holds the first-use lock while `backend` has no instance in this process yet."""
    if backend is not None:
        with _locks_lock:
            lock = _first_use_locks.setdefault(backend, threading.Lock())
    while True:
        if backend is None or backend in _warm_backends:
            yield
            return
        if lock.acquire(timeout=_POLL_SECS):
            if backend not in _warm_backends:
                break
            lock.release()  # warmed meanwhile: no need to wait for the others
        if given_up.is_set():
            raise Unavailable("given up while waiting for another load of a backend's first use")
    try:
        yield
        if warms:
            _warm_backends.add(backend)
    finally:
        lock.release()


async def in_thread(fn: Callable[[], T], what: str, deadline: float | None, timeout_message: str = "", *,
                    backend: str | None = None, warms: bool = False, cancel: LoadCancel | None = None,
                    on_late: Callable[[asyncio.Future], None] | None = None) -> T:
    """`fn()` on a new daemon thread; its result, or its exception. `backend`: a step of that
    backend's first use, serialized (`warms`: its success ends the first use). Past `deadline`
    (`time.monotonic()`) or when the caller is cancelled, the load is given up: `cancel` is set (the
    backend stops what it started), `on_late` gets the thread's future should it still finish, and a
    `LoadTimeout(timeout_message)` is raised (a cancel propagates as itself)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    context = contextvars.copy_context()  # as asyncio.to_thread does
    given_up = threading.Event()

    def run() -> None:
        try:
            with _first_use(backend, warms, given_up):
                result = context.run(fn)
        except BaseException as e:
            outcome = (None, e)
        else:
            outcome = (result, None)
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server has gone
            loop.call_soon_threadsafe(_settle, future, *outcome)

    threading.Thread(target=run, name=f"load-{what}", daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.shield(future), None if deadline is None
                                      else max(0.0, deadline - time.monotonic()))
    except (TimeoutError, asyncio.CancelledError) as e:
        given_up.set()
        if cancel is not None:
            cancel.set()
        if on_late is not None:
            future.add_done_callback(on_late)
        else:
            future.add_done_callback(_consume)
        if isinstance(e, asyncio.CancelledError):
            raise
        raise LoadTimeout(timeout_message or f"{what} did not finish before its deadline") from None


def _consume(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "exception was never retrieved" warning
