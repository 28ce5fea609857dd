"""Assembles one server instance: plugins, model manager, data plane, and the three listeners."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import ssl
import time
from pathlib import Path

import pluggy
from prometheus_client import CollectorRegistry

from ..core.extensions import HttpTls
from ..core.plugins import collect_backends, create_plugin_manager
from ..core.settings import ServerConfig
from ..dataplane import DataPlane
from ..observability.llm_metrics import LLMMetricsCollector
from ..observability.metrics import CallbackCounter, MetricsPage, MetricsServer, register_plugin_collectors
from .admin_address import AdminSplitInterceptor, AdminSplitMiddleware

log = logging.getLogger(__name__)
# After the drain, how long unloading (backends' finalize) may take before the process leaves anyway.
UNLOAD_GRACE_SECS = 5.0
FLUSH_GRACE_SECS = 2.0


class StartupError(Exception):
    """A start that cannot go on (a port in use, a missing repository, a failed startup load with
    --exit-on-error): one line for the operator, no traceback, a non-zero exit."""


# The flag that sets each listener's port, for errors about it.
PORT_FLAGS = {"http": "--http-port", "admin_http": "--admin-http-port", "grpc": "--grpc-port",
              "admin_grpc": "--admin-grpc-port", "metrics": "--metrics-port"}


def cannot_listen(name: str, host: str, port: int, reason: str) -> StartupError:
    return StartupError(f"cannot listen on {host}:{port} ({PORT_FLAGS.get(name, name)}): {reason}")


def bind_socket(host: str, port: int, name: str = "http") -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise cannot_listen(name, host, port, e.strerror or str(e)) from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _uvicorn_ssl_options(tls: HttpTls | None) -> dict:
    if tls is None:
        return {}
    options = {"ssl_certfile": str(tls.certfile), "ssl_keyfile": str(tls.keyfile)}
    if tls.client_ca is not None:
        options |= {"ssl_ca_certs": str(tls.client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return options


class Server:
    def __init__(self, settings: ServerConfig, plugin_manager: pluggy.PluginManager | None = None):
        self.settings = settings
        self.pm = plugin_manager or create_plugin_manager()
        self.dataplane = DataPlane(settings, collect_backends(self.pm), self._device_reports)
        self.manager = self.dataplane.manager
        self.registry = CollectorRegistry()  # this instance's own; never the global one
        self.registry.register(LLMMetricsCollector(self.dataplane))  # every LLM backend's vllm:* family
        register_plugin_collectors(self.pm, self.dataplane, self.registry)
        self.registry.register(CallbackCounter(
            "modelplex_trace_spans_dropped", "Spans dropped because the trace export could not keep up",
            lambda: self.dataplane.tracing.num_dropped))
        # the metrics port's and HTTP /metrics
        self.metrics_page = MetricsPage(self.manager.loaded_stats, self.registry, self.dataplane.engine_waiting)
        self.ports: dict[str, int] = {}
        self._http_servers: list[tuple[object, asyncio.Task]] = []  # (uvicorn server, its serve task)
        self._grpc_servers: list = []
        self._metrics_httpd = None

    async def start(self) -> None:
        """Open the listeners first (so liveness answers during long loads; readiness waits for the
        startup load), then load models. Raises StartupError for what an operator must fix."""
        s = self.settings
        for root in s.model_repositories:
            if not Path(root).is_dir():
                message = f"model repository {root} does not exist or is not a folder (--model-repository)"
                if s.exit_on_error:
                    raise StartupError(message)
                log.error("%s; serving on (--exit-on-error=false)", message)
        if s.allow_http:
            await self._start_http()
        if s.allow_grpc:
            await self._start_grpc()
        if s.allow_metrics:
            self._metrics_httpd = MetricsServer(s.host, s.metrics_port, self.metrics_page)
            try:
                await self._metrics_httpd.start()
            except OSError as e:
                raise cannot_listen("metrics", s.host, s.metrics_port, e.strerror or str(e)) from None
            self.ports["metrics"] = self._metrics_httpd.port
            log.info("metrics listening on %s:%d", s.host, self.ports["metrics"])
        await self.manager.start()
        failures = self.manager.startup_failures
        if failures and s.exit_on_error:
            raise StartupError(f"{len(failures)} model(s) failed to load at startup (--exit-on-error): "
                               + "; ".join(f"{name}: {reason}" for name, reason in sorted(failures.items())))
        log.info("modelplex ready: %s", self.ports)

    async def _start_http(self) -> None:
        from ..http.access import AccessMiddleware
        from ..http.app import create_http_app

        s = self.settings
        app = create_http_app(self.dataplane, s, self._http_routers())
        checks = self._access_checks("http")
        if checks:
            app = AccessMiddleware(app, checks)
        for wrap in reversed([w for ws in self.pm.hook.modelplex_http_middleware(settings=s) for w in ws or ()]):
            app = wrap(app)
        if s.access_log:
            from ..http.access_log import AccessLogMiddleware

            app = AccessLogMiddleware(app)
        tls = self.pm.hook.modelplex_http_tls(settings=s)
        host = s.http_address or s.host
        if s.admin_http_port is None:
            self._http_servers.append(await self._serve_http(app, host, s.http_port, "http", tls))
            return
        self._http_servers.append(await self._serve_http(AdminSplitMiddleware(app, False), host, s.http_port,
                                                         "http", tls))
        self._http_servers.append(await self._serve_http(AdminSplitMiddleware(app, True), s.admin_host or s.host,
                                                         s.admin_http_port, "admin_http", tls))

    async def _serve_http(self, app, host: str, port: int, name: str, tls: HttpTls | None):
        import uvicorn

        from ..http.coalescing_protocol import CoalescingHttpToolsProtocol

        class QuietUvicorn(uvicorn.Server):
            """uvicorn without its own SIGINT/SIGTERM handlers: `serve()` owns the signals, so a
            SIGTERM drains in-flight requests instead of closing the port at once."""

            def capture_signals(self):
                return contextlib.nullcontext()

        sock = bind_socket(host, port, name)
        self.ports[name] = sock.getsockname()[1]
        log.info("%s listening on %s:%d", name.replace("_", " ").upper().replace("ADMIN ", "admin "), host,
                 self.ports[name])
        # log_config=None: uvicorn's lines go through the server's own handler (text or JSON), not its own.
        config = uvicorn.Config(app, loop="none", http=CoalescingHttpToolsProtocol, lifespan="off", access_log=False,
                                log_config=None, log_level="warning", timeout_keep_alive=75, backlog=2048,
                                proxy_headers=False, **_uvicorn_ssl_options(tls))
        server = QuietUvicorn(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                task.result()  # a failed start (e.g. an unreadable certificate) raises here
            await asyncio.sleep(0.01)
        return server, task

    def _device_reports(self) -> list:
        return [r for r in self.pm.hook.modelplex_devices() if r is not None]

    def _access_checks(self, transport: str) -> list:
        return [c.check for found in self.pm.hook.modelplex_access_controls(settings=self.settings)
                for c in found or () if c.transport == transport]

    def _http_routers(self) -> list:
        """What the HTTP door mounts beside its own routes: the OpenAI routes, the status page and
        the plugins' routers."""
        from ..openai import create_openai_router
        from .metrics_route import metrics_router
        from .status_page import create_status_router

        routers = [create_status_router(), create_openai_router(self.dataplane), metrics_router(self.metrics_page)]
        for found in self.pm.hook.modelplex_http_routers(dataplane=self.dataplane):
            routers += found or []
        return routers

    def num_inflight(self) -> int:
        """Requests and streams admitted by a model version and not finished yet."""
        return sum(mv.inflight for entry in self.manager.entries.values() for mv in entry.versions.values())

    async def _start_grpc(self) -> None:
        from ..grpc.access import AccessInterceptor, server_credentials
        from ..grpc.server import create_grpc_server

        s = self.settings
        interceptors = [i for found in self.pm.hook.modelplex_grpc_interceptors(settings=s) for i in found or ()]
        checks = self._access_checks("grpc")
        if checks:
            interceptors.insert(0, AccessInterceptor(checks))
        tls = self.pm.hook.modelplex_grpc_tls(settings=s)
        if tls is not None:
            credentials = server_credentials(tls)
        else:
            credentials = self.pm.hook.modelplex_grpc_credentials(settings=s)
        host = s.grpc_address or s.host
        listeners = [(host, s.grpc_port, "grpc", None)]
        if s.admin_grpc_port is not None:
            listeners = [(host, s.grpc_port, "grpc", AdminSplitInterceptor(False)),
                         (s.admin_host or s.host, s.admin_grpc_port, "admin_grpc", AdminSplitInterceptor(True))]
        if s.access_log:
            from ..grpc.access_log import AccessLogInterceptor

            interceptors.insert(0, AccessLogInterceptor())
        for host, port, name, split in listeners:
            try:
                server, self.ports[name] = create_grpc_server(self.dataplane, s, ([split] if split else [])
                                                              + interceptors, credentials, host, port)
            except RuntimeError as e:  # grpc's bind failure
                raise cannot_listen(name, host, port, str(e)) from None
            log.info("%s listening on %s:%d", "gRPC" if name == "grpc" else "admin gRPC", host, self.ports[name])
            await server.start()
            self._grpc_servers.append(server)

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
        for grpc_server in self._grpc_servers:
            await grpc_server.stop(remaining)
        for http_server, _ in self._http_servers:
            http_server.config.timeout_graceful_shutdown = remaining
            http_server.should_exit = True
        for _, task in self._http_servers:
            await task
        if self._metrics_httpd is not None:
            await self._metrics_httpd.close()
        # The spans still queued, for at most 2 s (on the loop: nothing else runs now).
        self.dataplane.tracing.shutdown()
        try:
            await asyncio.wait_for(self.manager.stop(), max(remaining, UNLOAD_GRACE_SECS))
        except TimeoutError:
            log.warning("models still unloading %.0fs after the drain; exiting anyway", UNLOAD_GRACE_SECS)
            return False
        return True


async def serve(settings: ServerConfig, port_file: Path | None = None,
                plugin_manager: pluggy.PluginManager | None = None) -> int:
    """Runs until SIGINT/SIGTERM, then stops gracefully; a second signal cuts the wait short. Returns
    the exit status: 1 when the start failed (`StartupError`, logged as one line)."""
    server = Server(settings, plugin_manager)
    stop, force = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        (force if stop.is_set() else stop).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        started = await _started(server, stop)
    except StartupError as e:
        log.error("%s", e)
        await server.stop(timeout=0)
        logging.shutdown()
        os._exit(1)  # as after a stop that overran: a backend thread may still be busy
    if started:
        if port_file is not None:
            tmp = port_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(server.ports))
            tmp.replace(port_file)
        message = (f"modelplex serving: HTTP {server.ports.get('http')}, gRPC {server.ports.get('grpc')}, "
                   f"metrics {server.ports.get('metrics')}")
        if settings.log_format == "json":
            log.info("%s", message)  # stdout carries nothing but JSON lines then
        else:
            print(message, flush=True)
        await stop.wait()
    if not await server.stop(force=force) or not started:
        # A backend thread is still busy (a Python model inside a long execute, an instance still
        # being created): as Triton does after its exit timeout, leave without waiting for it.
        logging.shutdown()
        os._exit(0)
    return 0


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
