"""Server-sent events over a data-plane response stream: the first response decides the status.

Waiting for the first response before answering lets an error that happens at admission (bad
input, queue full) keep its HTTP status; later errors can only travel as an event. Starlette
cancels the body iterator when the client disconnects, and the cancellation unwinds every
generator below it (for an LLM, the engine's stream aborts the request and frees its KV blocks).
"""
from __future__ import annotations

import contextlib
from typing import AsyncIterator, Callable

import orjson
from starlette.responses import StreamingResponse

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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


def sse_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream; charset=utf-8", headers=SSE_HEADERS)


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
        except Exception as exc:  # noqa: BLE001 - the status line is gone; tell the client in-band
            yield sse_event(on_error(exc))
