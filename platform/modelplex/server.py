"""Assembles one server instance: plugins, model manager, data plane, and the three listeners."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from .dataplane import DataPlane
from .manager import ModelManager
from .metrics import MetricsServer, register_plugin_collectors
from .plugins import collect_backends, create_plugin_manager
from .settings import ServerConfig

log = logging.getLogger(__name__)
# After the drain, how long unloading (backends' finalize) may take before the process leaves anyway.
UNLOAD_GRACE_SECS = 5.0
FLUSH_GRACE_SECS = 2.0


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
        register_plugin_collectors(self.pm, self.dataplane, self.registry)
        self.ports: dict[str, int] = {}
        self._http = self._grpc = self._metrics_httpd = None
        self._http_task: asyncio.Task | None = None

    async def start(self) -> None:
        """Open the listeners first (so liveness answers during long loads), then load models."""
        s = self.settings
        if s.allow_http:
            await self._start_http()
        if s.allow_grpc:
            await self._start_grpc()
        if s.allow_metrics:
            self._metrics_httpd = MetricsServer(s.host, s.metrics_port, self.manager.loaded_stats, self.registry)
            self.ports["metrics"] = self._metrics_httpd.port
        await self.manager.start()
        log.info("modelplex ready: %s", self.ports)

    async def _start_http(self) -> None:
        import uvicorn

        class QuietUvicorn(uvicorn.Server):
            """uvicorn without its own SIGINT/SIGTERM handlers: `serve()` owns the signals, so a
            SIGTERM drains in-flight requests instead of closing the port at once."""

            def capture_signals(self):
                return contextlib.nullcontext()
        from modelplex_admin.http_access import secure_http_app
        from modelplex_admin.policy import AccessPolicy
        from modelplex_admin.tls import uvicorn_ssl_options

        from .http.app import create_http_app
        from .http.protocol import CoalescingHttpToolsProtocol

        security = self.settings.security
        app = secure_http_app(create_http_app(self.dataplane, self.settings, self.pm),
                              AccessPolicy(security, security.http_restricted))
        sock = bind_socket(self.settings.host, self.settings.http_port)
        self.ports["http"] = sock.getsockname()[1]
        config = uvicorn.Config(app, loop="none", http=CoalescingHttpToolsProtocol, lifespan="off", access_log=False,
                                log_level="warning", timeout_keep_alive=75, backlog=2048,
                                proxy_headers=False, **uvicorn_ssl_options(security))
        self._http = QuietUvicorn(config)
        self._http_task = asyncio.create_task(self._http.serve(sockets=[sock]))
        while not self._http.started:
            await asyncio.sleep(0.01)

    def num_inflight(self) -> int:
        """Requests and streams admitted by a model version and not finished yet."""
        return sum(mv.inflight for entry in self.manager.entries.values() for mv in entry.versions.values())

    async def _start_grpc(self) -> None:
        from modelplex_admin.grpc_access import grpc_interceptors
        from modelplex_admin.policy import AccessPolicy
        from modelplex_admin.tls import grpc_server_credentials

        from .grpc.server import create_grpc_server

        security = self.settings.security
        self._grpc, self.ports["grpc"] = create_grpc_server(
            self.dataplane, self.settings, grpc_interceptors(AccessPolicy(security, security.grpc_restricted)),
            grpc_server_credentials(security))
        await self._grpc.start()

    async def stop(self, timeout: float | None = None, force: asyncio.Event | None = None) -> bool:
        """Graceful stop: turn not-ready and refuse new requests at once (the listeners stay open so
        probes see it), let in-flight requests and streams finish for up to `timeout` seconds
        (`--exit-timeout-secs`) or until `force` is set, then close the listeners and unload.
        False when the unload overran its grace (a backend still busy with a cut-off request)."""
        timeout = self.settings.exit_timeout_secs if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.dataplane.accepting = False
        log.info("stopping: %d requests in flight, waiting up to %.0fs", self.num_inflight(), timeout)
        while self.num_inflight() and time.monotonic() < deadline and not (force and force.is_set()):
            await asyncio.sleep(0.05)
        if self.num_inflight():
            log.warning("stopping with %d requests still in flight", self.num_inflight())
        # Past the drain only responses already produced are left to send: a short grace, also
        # because an idle TLS connection would hold the exit until the SSL shutdown times out (30 s).
        remaining = 0.0 if force and force.is_set() else min(FLUSH_GRACE_SECS, max(0.5, deadline - time.monotonic()))
        if self._grpc is not None:
            await self._grpc.stop(remaining)
        if self._http is not None:
            self._http.config.timeout_graceful_shutdown = remaining
            self._http.should_exit = True
            await self._http_task
        if self._metrics_httpd is not None:
            self._metrics_httpd.close()
        await asyncio.to_thread(self.dataplane.tracing.shutdown)  # the spans still queued, for at most 2 s
        try:
            await asyncio.wait_for(self.manager.stop(), max(remaining, UNLOAD_GRACE_SECS))
        except asyncio.TimeoutError:
            log.warning("models still unloading %.0fs after the drain; exiting anyway", UNLOAD_GRACE_SECS)
            return False
        return True


async def serve(settings: ServerConfig, port_file: Path | None = None) -> None:
    """Runs until SIGINT/SIGTERM, then stops gracefully; a second signal cuts the wait short."""
    server = Server(settings)
    stop, force = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        (force if stop.is_set() else stop).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    started = await _started(server, stop)
    if started:
        if port_file is not None:
            tmp = port_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(server.ports))
            tmp.replace(port_file)
        print(f"modelplex serving: HTTP {server.ports.get('http')}, gRPC {server.ports.get('grpc')}, "
              f"metrics {server.ports.get('metrics')}", flush=True)
        await stop.wait()
    if not await server.stop(force=force) or not started:
        # A backend thread is still busy (a Python model inside a long execute, an instance still
        # being created): as Triton does after its exit timeout, leave without waiting for it.
        logging.shutdown()
        os._exit(0)


async def _started(server: Server, stop: asyncio.Event) -> bool:
    """Starts `server`; False when a signal came first (models still loading: nothing is in flight yet,
    so the start is abandoned rather than finished, which could take longer than the pod's grace)."""
    starting = asyncio.create_task(server.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if starting.done():
        starting.result()  # a failed start raises here
        return True
    log.info("signal received while starting: abandoning the start")
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await starting
    return False
