"""A real `modelplex.server.assembly.Server` run inside the test's event loop, its spans kept in memory."""
from __future__ import annotations

import contextlib
from pathlib import Path

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

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
