"""Giving the memory of a loaded or retired model back to the operating system.

Loading leaves temporaries behind (dequantized and repacked weights), and a retired engine's objects
can sit in reference cycles that only the cyclic collector frees, a few seconds after its unload
returns (its loop thread and last requests let go of it). glibc keeps what is freed in its arenas,
so without this the server's RSS kept ~380 MB of load temporaries and grew by 150–450 MB with each
LLM reload (benchmarks/soak.py). `malloc_trim(0)` returns every arena's free pages; on other C
libraries only the collection runs.
"""
from __future__ import annotations

import asyncio
import ctypes
import gc

from ..core.errors import Overloaded

_PASSES_AFTER_S = (0, 2, 10)  # seconds after the event: what the last references hold goes by then


def _malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()
_pending: asyncio.Task | None = None


def _release() -> None:
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


async def _release_passes() -> None:
    start = asyncio.get_running_loop().time()
    for at in _PASSES_AFTER_S:
        await asyncio.sleep(max(0.0, start + at - asyncio.get_running_loop().time()))
        await asyncio.to_thread(_release)  # off the event loop; malloc_trim releases the GIL


def release_freed_memory_soon() -> None:
    """After a model loads or is retired: collect and trim now and twice more shortly after, off the
    event loop (one series at a time; a series under way covers a new event)."""
    global _pending
    if _pending is None or _pending.done():
        _pending = asyncio.ensure_future(_release_passes())


class RequestMemory:
    """The bytes of request bodies in flight, server-wide, under one budget (`--max-request-memory-bytes`,
    0: none): a request that would pass it is refused at once (`Overloaded`: 503 / RESOURCE_EXHAUSTED)
    instead of taking memory the server may not have. HTTP infer bodies and gRPC infer messages (unary
    and streamed) reserve their size until answered.

    Large transient use leaves glibc holding the freed pages (a 4 MB request stream drove RSS to 5 GB):
    once `TRIM_AFTER_BYTES` were released and little is in flight, `malloc_trim` runs off the event
    loop, at most every `TRIM_INTERVAL_S`. Used on the event loop only.
    """

    TRIM_AFTER_BYTES = 256 << 20
    TRIM_INTERVAL_S = 10.0

    def __init__(self, limit: int):
        self.limit = limit
        self.in_use = 0
        self.num_refused = 0
        self._released = 0  # since the last trim
        self._last_trim = 0.0

    def reserve(self, num_bytes: int) -> None:
        if self.limit and self.in_use + num_bytes > self.limit:
            self.num_refused += 1
            raise Overloaded(f"the server holds {self.in_use} bytes of requests in flight; one of {num_bytes} more "
                             f"would pass its limit of {self.limit} (--max-request-memory-bytes)", retry_after=1.0)
        self.in_use += num_bytes

    def release(self, num_bytes: int) -> None:
        self.in_use -= num_bytes
        self._released += num_bytes
        if self._released >= self.TRIM_AFTER_BYTES and self.in_use < self.TRIM_AFTER_BYTES // 4:
            loop = asyncio.get_running_loop()
            if loop.time() - self._last_trim >= self.TRIM_INTERVAL_S and _MALLOC_TRIM is not None:
                self._released, self._last_trim = 0, loop.time()
                loop.run_in_executor(None, _MALLOC_TRIM, 0)  # releases the GIL; no gc pass: it would hold it
