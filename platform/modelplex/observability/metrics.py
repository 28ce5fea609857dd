"""Prometheus metrics with Triton's exact names, read from the models' statistics at scrape time.

The request path only adds integers to `ModelStats`; a scrape turns them into Triton's
`nv_inference_*` families (no `_total` suffix, as Triton prints them). Other metrics (LLM histograms)
live on a `CollectorRegistry` owned by the server instance and are appended to the same page.
"""
from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily

from .host_metrics import CpuMetrics, GpuMetrics
from .stats import ModelStats

log = logging.getLogger(__name__)

# (name, type, help, value of one model version's stats)
_FAMILIES: list[tuple[str, str, str, Callable[[ModelStats], float]]] = [
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes",
     lambda s: s.phases["success"].count),
    ("nv_inference_count", "counter", "Number of inferences performed (a batch of n counts n)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (a batch counts once)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds",
     lambda s: (s.phases["success"].ns + s.phases["fail"].ns) // 1000),
    ("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds",
     lambda s: s.phases["queue"].ns // 1000),
    ("nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration in microseconds",
     lambda s: s.phases["compute_input"].ns // 1000),
    ("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration in microseconds",
     lambda s: s.phases["compute_infer"].ns // 1000),
    ("nv_inference_compute_output_duration_us", "counter", "Cumulative compute output duration in microseconds",
     lambda s: s.phases["compute_output"].ns // 1000),
    ("nv_inference_pending_request_count", "gauge",
     "Instantaneous number of pending requests awaiting execution per-model", lambda s: s.pending),
    ("nv_model_load_duration_secs", "gauge", "Model load time in seconds", lambda s: s.load_seconds),
]


FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


def _labels(labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in labels.items())
    return "{" + inner + "}"


def triton_metrics_text(all_stats: Iterable[ModelStats]) -> str:
    """Triton's families in Prometheus text format. Written by hand because prometheus_client
    renames counters to `*_total`, which would break dashboards built on Triton's names."""
    all_stats = list(all_stats)
    lines = []
    for name, kind, doc, read in _FAMILIES:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{_labels({'model': s.name, 'version': s.version})} {float(read(s))}" for s in all_stats]
    name = "nv_inference_request_failure"
    lines += [f"# HELP {name} Number of failed inference requests, all batch sizes", f"# TYPE {name} counter"]
    for s in all_stats:
        for reason in FAILURE_REASONS:  # all of them, zeros included, as Triton prints them
            count = s.failures.get(reason, 0)
            lines.append(f"{name}{_labels({'model': s.name, 'reason': reason, 'version': s.version})} {float(count)}")
    lines += _ensemble_step_lines(all_stats)
    return "\n".join(lines) + "\n"


def _ensemble_step_lines(all_stats: list[ModelStats]) -> list[str]:
    """Per ensemble step (labels: the ensemble's model/version, the step's number and model): how
    often it ran and its cumulative time, as Triton's counters are spelled (no `_total`)."""
    rows = [(s, step, d) for s in all_stats for step, d in s.steps.items()]
    if not rows:
        return []
    lines = []
    for name, doc, read in (
            ("modelplex_ensemble_step_count", "Number of times an ensemble step ran (successfully or not)",
             lambda d: d.count),
            ("modelplex_ensemble_step_duration_us", "Cumulative duration of an ensemble step in microseconds",
             lambda d: d.ns // 1000)):
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} counter"]
        for s, step, d in rows:
            number, _, step_model = step.partition(":")
            labels = {"model": s.name, "step": number, "step_model": step_model, "version": s.version}
            lines.append(f"{name}{_labels(labels)} {float(read(d))}")
    return lines


class CallbackCounter:
    """A prometheus_client collector: one unlabelled counter read from `read()` at scrape time."""

    def __init__(self, name: str, documentation: str, read: Callable[[], float]):
        self.name, self.documentation, self.read = name, documentation, read

    def describe(self):
        return [CounterMetricFamily(self.name, self.documentation)]

    def collect(self):
        yield CounterMetricFamily(self.name, self.documentation, value=self.read())


def register_plugin_collectors(pm, dataplane, registry: CollectorRegistry) -> None:
    """Put every plugin's `modelplex_metric_collectors` on this server's registry; a collector
    whose family names are already taken is logged and skipped (the one registered before keeps them)."""
    for collectors in pm.hook.modelplex_metric_collectors(dataplane=dataplane):
        for collector in collectors or ():
            try:
                registry.register(collector)
            except ValueError as exc:  # prometheus_client: "Duplicated timeseries in CollectorRegistry"
                log.warning("metric collector %r is skipped: %s", collector, exc)


class MetricsPage:
    """The `/metrics` text: Triton's families plus whatever is in `registry` (histograms etc.); served by
    the metrics port and the HTTP port alike."""

    def __init__(self, stats_source: Callable[[], Iterable[ModelStats]], registry: CollectorRegistry):
        self.stats_source, self.registry = stats_source, registry
        self.cpu, self.gpu = CpuMetrics(), GpuMetrics()
        self._lock = threading.Lock()  # the CPU figure is a delta between two renders

    def render(self) -> str:
        with self._lock:
            return (triton_metrics_text(self.stats_source()) + self.cpu.text() + self.gpu.text()
                    + generate_latest(self.registry).decode())


class MetricsServer:
    """`GET /metrics` on its own port (a `MetricsPage`)."""

    def __init__(self, host: str, port: int, page: MetricsPage):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = outer.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.page = page
        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_port
        threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True).start()

    def render(self) -> str:
        return self.page.render()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
