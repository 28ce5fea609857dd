"""The hooks a modelplex plugin may implement (entry-point group `modelplex`)."""
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
