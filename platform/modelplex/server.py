"""Assembles one server instance: plugins, model manager, data plane, and the three listeners."""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
from pathlib import Path

from prometheus_client import CollectorRegistry

from .dataplane import DataPlane
from .manager import ModelManager
from .metrics import MetricsServer
from .plugins import collect_backends, create_plugin_manager
from .settings import ServerConfig

log = logging.getLogger(__name__)


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Server:
    def __init__(self, settings: ServerConfig, plugin_manager=None):
        self.settings = settings
        self.pm = plugin_manager or create_plugin_manager()
        self.manager = ModelManager(settings, collect_backends(self.pm))
        self.registry = CollectorRegistry()  # this instance's own; never the global one
        self.dataplane = DataPlane(settings, self.manager)
        self.manager.dataplane = self.dataplane  # ensembles call their steps through it
        self.ports: dict[str, int] = {}
        self._http = self._grpc = self._metrics_httpd = None
        self._http_task: asyncio.Task | None = None

    async def start(self) -> None:
        """Open the listeners first (so liveness answers during long loads), then load models."""
        s = self.settings
        if s.allow_http:
            await self._start_http()
        if s.allow_grpc:
            from .grpc.server import create_grpc_server

            self._grpc, self.ports["grpc"] = create_grpc_server(self.dataplane, s)
            await self._grpc.start()
        if s.allow_metrics:
            self._metrics_httpd = MetricsServer(s.host, s.metrics_port, self.manager.loaded_stats, self.registry)
            self.ports["metrics"] = self._metrics_httpd.port
        await self.manager.start()
        log.info("modelplex ready: %s", self.ports)

    async def _start_http(self) -> None:
        import uvicorn

        from .http.app import create_http_app
        from .http.protocol import CoalescingHttpToolsProtocol

        app = create_http_app(self.dataplane, self.settings, self.pm)
        sock = bind_socket(self.settings.host, self.settings.http_port)
        self.ports["http"] = sock.getsockname()[1]
        config = uvicorn.Config(app, loop="none", http=CoalescingHttpToolsProtocol, lifespan="off", access_log=False,
                                log_level="warning", timeout_keep_alive=75, backlog=2048,
                                proxy_headers=False)
        self._http = uvicorn.Server(config)
        self._http_task = asyncio.create_task(self._http.serve(sockets=[sock]))
        while not self._http.started:
            await asyncio.sleep(0.01)

    async def stop(self, grace: float = 5.0) -> None:
        self.dataplane.accepting = False
        if self._grpc is not None:
            await self._grpc.stop(grace)
        if self._http is not None:
            self._http.should_exit = True
            await self._http_task
        await self.manager.stop()
        if self._metrics_httpd is not None:
            self._metrics_httpd.close()


async def serve(settings: ServerConfig, port_file: Path | None = None) -> None:
    server = Server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(server.ports))
        tmp.replace(port_file)
    print(f"modelplex serving: HTTP {server.ports.get('http')}, gRPC {server.ports.get('grpc')}, "
          f"metrics {server.ports.get('metrics')}", flush=True)
    await stop.wait()
    await server.stop()
