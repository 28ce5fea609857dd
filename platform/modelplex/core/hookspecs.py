"""The hooks a modelplex plugin may implement (entry-point group `modelplex`).

Every hook returns declarations (records, middleware, interceptors); the host applies them. A plugin
never patches the host.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

hookspec = pluggy.HookspecMarker("modelplex")
hookimpl = pluggy.HookimplMarker("modelplex")


@hookspec
def modelplex_backends():
    """Return a list of `modelplex.BackendSpec` this plugin provides.

    Example: ``return [BackendSpec(name="onnx", create_instance=OnnxInstance.create)]``
    """


@hookspec
def modelplex_http_routers(dataplane):
    """Return a list of FastAPI `APIRouter`s to mount on the HTTP port, built over `dataplane`.

    Example: ``return [make_adapter_router(dataplane)]``
    """


@hookspec
def modelplex_metric_collectors(dataplane) -> list[Collector]:
    """Return `prometheus_client` collectors to register on this server's own `CollectorRegistry`.

    Called once per server instance (each has its own registry; never the global one). A
    collector reads its numbers at scrape time, on the metrics thread: walk
    `dataplane.ready_instances()` and keep the request path down to plain increments. Implement
    `describe()` too, so a family name two plugins both claim is caught at startup (the second
    collector is then logged and skipped). Every family must be documented in docs/metrics.md.

    Example::

        class QueueDepth:
            def __init__(self, dataplane):
                self.dataplane = dataplane

            def describe(self):
                yield GaugeMetricFamily("my_queue_depth", "Requests queued", labels=["model", "version"])

            def collect(self):
                family = GaugeMetricFamily("my_queue_depth", "Requests queued", labels=["model", "version"])
                for model, version, instance in self.dataplane.ready_instances():
                    if isinstance(instance, MyInstance):
                        family.add_metric([model, version], instance.queue_depth)
                yield family

        @hookimpl
        def modelplex_metric_collectors(dataplane):
            return [QueueDepth(dataplane)]
    """


@hookspec
def modelplex_serve_options():
    """Return a list of `modelplex.ServeOption`: flags this plugin adds to `modelplex serve`.

    Example: ``return [ServeOption(("--admin-token",), "bearer token for model control", action="append", default=[])]``
    """


@hookspec
def modelplex_check_settings(settings):
    """Raise `ValueError` (its message names the flags) when `settings.plugin_options` contradict
    each other; `modelplex serve` then exits with a usage error before anything starts.

    Example: ``if opts["http_root_cert"] and not opts["http_server_cert"]: raise ValueError("...")``
    """


@hookspec
def modelplex_access_controls(settings):
    """Return `modelplex.AccessControl` records: checks the host runs before every HTTP request or
    gRPC call (streams included) and answers with the same refusal on both transports.

    Example: ``return [AccessControl("http", http_policy.check), AccessControl("grpc", grpc_policy.check)]``
    """


@hookspec
def modelplex_http_middleware(settings):
    """Return ASGI middleware factories (`app -> app`) wrapped around every HTTP listener's app, the
    fast infer path included; the first returned is the outermost. (For access checks, prefer
    `modelplex_access_controls`, which covers gRPC too.)

    Example: ``return [lambda app: RequestLogger(app)]``
    """


@hookspec
def modelplex_grpc_interceptors(settings):
    """Return `grpc.aio.ServerInterceptor`s run before every gRPC method, streams included.

    Example: ``return [CallLogger()]``
    """


@hookspec(firstresult=True)
def modelplex_http_tls(settings):
    """Return a `modelplex.HttpTls` to serve HTTPS, or None for plain HTTP.

    Example: ``return HttpTls(Path("server.pem"), Path("server.key"))``
    """


@hookspec(firstresult=True)
def modelplex_grpc_tls(settings):
    """Return a `modelplex.GrpcTls` to make the gRPC ports TLS ports, or None for insecure ports.

    Example: ``return GrpcTls(Path("server.pem"), Path("server.key"), Path("ca.pem"), mutual=True)``
    """


@hookspec(firstresult=True)
def modelplex_grpc_credentials(settings):
    """Return `grpc.ServerCredentials` for the gRPC ports (when `modelplex_grpc_tls`'s record is not
    enough), or None.

    Example: ``return grpc.ssl_server_credentials([(key, cert)])``
    """


@hookspec
def modelplex_devices():
    """Return a `modelplex.DeviceReport`: the devices this plugin's runtime sees, which the host
    serves at `GET /v2/devices`. Called per request, off the event loop.

    Example: ``return DeviceReport("openvino", ov.get_version(), [{"name": "CPU", ...}])``
    """


@hookspec
def modelplex_commands():
    """Return a list of `modelplex.Command`: subcommands this plugin adds to `modelplex`.

    Example: ``return [Command("convert-openvino", "convert an LLM for OpenVINO GenAI", add_arguments, run)]``
    """
