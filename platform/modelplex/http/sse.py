"""Server-sent events over a data-plane response stream, and cancelling work whose client left.

Waiting for the first response before answering lets an error that happens at admission (bad
input, queue full) keep its HTTP status; later errors can only travel as an event. Starlette
cancels the body iterator when the client disconnects, and the cancellation unwinds every
generator below it (for an LLM, the engine's stream aborts the request and frees its KV blocks);
a disconnect that lands while an event is being sent leaves the generator at `yield`, so the response
closes it (`ClosingStreamingResponse`). Before the body starts (queued, or a whole answer being
assembled) `until_disconnected` does it.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TypeVar

import orjson
from starlette.responses import StreamingResponse

from .body import ClientGone

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
T = TypeVar("T")
CLIENT_CLOSED = 499  # nginx's status for "client closed the request": logged, never read


async def until_disconnected(receive, work: Awaitable[T]) -> T:
    """`work`'s result, or ClientGone once the client disconnects (after cancelling `work`).

    Call only after the request body has been read: then `receive` answers only a disconnect.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        watcher.cancel()
    if task.cancelled():
        raise ClientGone()
    return task.result()


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def sse_event(data) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else orjson.dumps(data)) + b"\n\n"


async def first_and_rest(stream: AsyncIterator):
    """(first item or None, the stream) — raises what the stream raises before its first item."""
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        return None, stream
    except BaseException:
        await stream.aclose()
        raise
    return first, stream


class ClosingStreamingResponse(StreamingResponse):
    """Closes its events however the response ends. A client that leaves while an event is being sent
    ends the response in `send`, with the events' generator suspended at `yield`: unclosed, its request
    would run on until the generator is garbage-collected (reference counting does it today; a cycle
    would not)."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


def sse_response(events: AsyncGenerator[bytes, None]) -> StreamingResponse:
    return ClosingStreamingResponse(events, media_type="text/event-stream; charset=utf-8", headers=SSE_HEADERS)


async def relay(first, stream: AsyncIterator, encode: Callable, on_error: Callable) -> AsyncIterator[bytes]:
    """Encode `first` and the rest of `stream` as events; an error mid-stream becomes one last event."""
    async with contextlib.aclosing(stream):
        try:
            if first is not None:
                for event in encode(first):
                    yield event
            async for item in stream:
                for event in encode(item):
                    yield event
        except Exception as exc:
            yield sse_event(on_error(exc))
