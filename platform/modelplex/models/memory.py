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
