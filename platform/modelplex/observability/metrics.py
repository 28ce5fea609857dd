"""Prometheus metrics with Triton's exact names, read from the models' statistics at scrape time.

The request path only adds integers to `ModelStats`; a scrape turns them into Triton's
`nv_inference_*` families (no `_total` suffix, as Triton prints them). Other metrics (LLM histograms)
live on a `CollectorRegistry` owned by the server instance and are appended to the same page.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable

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
    # Plus the requests waiting inside LLM engines (`triton_metrics_text`'s `engine_waiting`).
    ("nv_inference_pending_request_count", "gauge",
     "Instantaneous number of pending requests awaiting execution per-model", lambda s: s.pending),
    ("nv_model_load_duration_secs", "gauge", "Model load time in seconds", lambda s: s.load_seconds),
]


FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
PENDING = "nv_inference_pending_request_count"


def _labels(labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in labels.items())
    return "{" + inner + "}"


def triton_metrics_text(all_stats: Iterable[ModelStats],
                        engine_waiting: dict[tuple[str, str], int] | None = None) -> str:
    """Triton's families in Prometheus text format. Written by hand because prometheus_client
    renames counters to `*_total`, which would break dashboards built on Triton's names.
    `engine_waiting`: requests waiting inside LLM engines per (model, version), counted as pending
    (an engine takes requests into its own queue at once, so the host's count alone stays near 0)."""
    all_stats = list(all_stats)
    engine_waiting = engine_waiting or {}
    lines = []
    for name, kind, doc, read in _FAMILIES:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
        for s in all_stats:
            value = read(s) + (engine_waiting.get((s.name, s.version), 0) if name == PENDING else 0)
            lines.append(f"{name}{_labels({'model': s.name, 'version': s.version})} {float(value)}")
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
    the metrics port and the HTTP port alike. Rendered one at a time (collectors read engines and
    devices; the CPU figure is a delta between two renders)."""

    def __init__(self, stats_source: Callable[[], Iterable[ModelStats]], registry: CollectorRegistry,
                 engine_waiting: Callable[[], dict[tuple[str, str], int]] = dict):
        self.stats_source, self.registry, self.engine_waiting = stats_source, registry, engine_waiting
        self.cpu, self.gpu = CpuMetrics(), GpuMetrics()
        self._lock = threading.Lock()

    def render(self) -> str:
        with self._lock:
            return (triton_metrics_text(self.stats_source(), self.engine_waiting()) + self.cpu.text()
                    + self.gpu.text() + generate_latest(self.registry).decode())


class MetricsServer:
    """`GET /metrics` on its own port (a `MetricsPage`).

    Served by asyncio on the server's loop (an idle connection costs a coroutine, not a thread: 500
    idle connections made 500 threads), at most `max_connections` at once: beyond, the connection that
    has waited longest without sending its request is closed (so idle ones cannot lock a scraper out),
    and each request must arrive within `timeout` seconds. The page is rendered on a worker thread.
    """

    def __init__(self, host: str, port: int, page: MetricsPage, max_connections: int = 256, timeout: float = 10.0):
        self.host, self.requested_port, self.page = host, port, page
        self.max_connections, self.timeout = max_connections, timeout
        self.num_connections = self.num_evicted = 0
        self._waiting: dict[asyncio.StreamWriter, None] = {}  # connections not past their request yet, oldest first
        self.port = 0
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """Bind and listen; an OSError (port in use) propagates."""
        self._server = await asyncio.start_server(self._serve, self.host, self.requested_port, backlog=128)
        self.port = self._server.sockets[0].getsockname()[1]

    def render(self) -> str:
        return self.page.render()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.num_connections >= self.max_connections and self._waiting:
            oldest = next(iter(self._waiting))
            del self._waiting[oldest]
            self.num_evicted += 1
            oldest.transport.abort()  # its read ends at once
        self.num_connections += 1
        self._waiting[writer] = None
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout)
            self._waiting.pop(writer, None)
            method, _, rest = head.partition(b" ")
            path = rest.partition(b" ")[0].split(b"?")[0]
            if method not in (b"GET", b"HEAD"):
                status, body, kind = b"405 Method Not Allowed", b"", b"text/plain"
            elif path != b"/metrics":
                status, body, kind = b"404 Not Found", b"not found\n", b"text/plain"
            else:
                page = (await asyncio.to_thread(self.render)).encode()
                status, body, kind = b"200 OK", page, CONTENT_TYPE_LATEST.encode()
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind + b"\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
                         + (body if method != b"HEAD" else b""))
            await asyncio.wait_for(writer.drain(), self.timeout)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # idle, cut short or oversized: dropped
        except Exception:
            log.exception("metrics request failed")
        finally:
            self._waiting.pop(writer, None)
            self.num_connections -= 1
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
