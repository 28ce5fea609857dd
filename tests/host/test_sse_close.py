"""An SSE response closes its events however it ends. A client that leaves while an event is being sent
ends the response inside the ASGI `send`, with the events' generator suspended at `yield`; closing it is
what stops the request behind it (an LLM's, freeing its KV blocks) at once rather than whenever the
generator is garbage-collected. The generator stays referenced here, so only an explicit close can run
its `finally`."""
from __future__ import annotations

import asyncio

import pytest

from modelplex.http.sse import sse_event, sse_response


@pytest.mark.parametrize("spec_version", ["2.4", "2.3"])  # starlette: send errors vs a disconnect message
def test_events_are_closed_when_the_client_leaves_during_a_send(spec_version):
    closed, sent = [], []
    gone = asyncio.Event()

    async def events():
        try:
            for i in range(100):
                yield sse_event({"i": i})
        finally:
            closed.append(True)

    async def send(message):
        sent.append(message)
        if len(sent) == 3:  # the response start, one event, then the client is gone mid-send
            gone.set()
            if spec_version == "2.4":
                raise OSError("connection reset")
            await asyncio.Event().wait()  # a send that never completes: the disconnect cancels it

    async def receive():
        await gone.wait()
        return {"type": "http.disconnect"}

    async def main():
        stream = events()
        response = sse_response(stream)
        scope = {"type": "http", "asgi": {"spec_version": spec_version}}
        try:
            await asyncio.wait_for(response(scope, receive, send), 10)
        except Exception:
            pass
        assert closed == [True], "the events' generator was left suspended at yield"
        assert stream.ag_frame is None  # finished, not waiting for the garbage collector

    asyncio.run(main())
