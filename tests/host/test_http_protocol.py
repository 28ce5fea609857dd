"""CoalescingTransport on a real socket pair: writes of one loop iteration reach the peer together,
at the end of that iteration; close sends what is held first."""
from __future__ import annotations

import asyncio
import socket

from modelplex.http.coalescing_protocol import CoalescingTransport


def test_writes_of_one_iteration_leave_together_at_its_end():
    async def scenario():
        loop = asyncio.get_running_loop()
        ours, peer = socket.socketpair()
        peer.setblocking(False)
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        coalescing = CoalescingTransport(transport, loop)
        coalescing.write(b"HTTP/1.1 200 OK\r\n\r\n")
        coalescing.write(b"body")
        try:
            early = peer.recv(100)
        except BlockingIOError:
            early = b""
        await asyncio.sleep(0)  # the iteration ends: the held writes go out
        await asyncio.sleep(0.05)
        both = peer.recv(100)
        coalescing.write(b"last words")
        coalescing.close()  # must not drop what is held
        await asyncio.sleep(0.05)
        tail = peer.recv(100)
        eof = peer.recv(100)
        peer.close()
        return early, both, tail, eof, coalescing.is_closing()

    early, both, tail, eof, closing = asyncio.run(scenario())
    assert early == b""
    assert both == b"HTTP/1.1 200 OK\r\n\r\nbody"
    assert (tail, eof, closing) == (b"last words", b"", True)
