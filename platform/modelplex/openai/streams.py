"""Several data-plane streams (one per prompt of a request) read as one: (prompt index, response) pairs in
arrival order. Leaving early, or an error in one, closes every stream (each backend aborts its request)."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from ..http.sse import first_and_rest

_DONE = object()


async def open_streams(streams: list[AsyncIterator]) -> list[tuple[object, AsyncIterator]]:
    """Each stream's first response, awaited before answering so admission errors keep their status;
    if one fails, the others are closed and its error raised."""
    opened = []
    try:
        for stream in streams:  # in order: a refused prompt leaves no later one queued
            opened.append(await first_and_rest(stream))
    except BaseException:
        for _, rest in opened:
            await rest.aclose()
        for stream in streams[len(opened) + 1:]:
            await stream.aclose()
        raise
    return opened


async def merged(opened: list[tuple[object, AsyncIterator]]) -> AsyncIterator[tuple[int, object]]:
    if len(opened) == 1:  # the common case needs no tasks
        (first, rest), = opened
        async with contextlib.aclosing(rest):
            if first is not None:
                yield 0, first
            async for item in rest:
                yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, first, rest: AsyncIterator) -> None:
        async with contextlib.aclosing(rest):
            try:
                if first is not None:
                    await queue.put((index, first))
                async for item in rest:
                    await queue.put((index, item))
                await queue.put((index, _DONE))
            except Exception as exc:
                await queue.put((index, exc))

    tasks = [asyncio.ensure_future(pump(i, first, rest)) for i, (first, rest) in enumerate(opened)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
