"""A real `modelplex.server.assembly.Server` run in-process: inside the test's event loop (its spans kept in
memory), or on an event loop of its own in a thread (so that sync clients can drive it)."""
from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from modelplex.core.plugins import create_plugin_manager
from modelplex.core.settings import ServerConfig
from modelplex.observability.tracing import TraceConfig, Tracing
from modelplex.server.assembly import Server


@contextlib.asynccontextmanager
async def traced_server(repo: Path, trace: TraceConfig, plugin_manager=None, **settings):
    """Yields (server, exporter): HTTP and gRPC on ephemeral ports, no metrics port."""
    config = ServerConfig(model_repositories=[repo], host="127.0.0.1", http_port=0, grpc_port=0,
                          allow_metrics=False, **settings)  # tracing off: no OTLP exporter process
    server = Server(config, plugin_manager)
    exporter = InMemorySpanExporter()
    server.dataplane.tracing = Tracing(trace, exporter=exporter)  # before start: the front doors read it
    await server.start()
    try:
        yield server, exporter
    finally:
        await server.stop()


@contextlib.contextmanager
def server_in_thread(settings: ServerConfig, plugin) -> Iterator[str]:
    """Yields the HTTP base URL of a server with `plugin` as its only plugin, run on its own event loop."""
    server = Server(settings, create_plugin_manager(allow=set(), extra=[plugin]))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(60)
    try:
        yield f"http://127.0.0.1:{server.ports['http']}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
