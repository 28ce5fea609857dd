"""Prometheus metrics with Triton's names, on a registry owned by one server instance."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

_LABELS = ("model", "version")


class ServerMetrics:
    """Triton's core `nv_inference_*` family, per model and version, so Triton dashboards work."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.success = Counter("nv_inference_request_success", "Number of successful inference requests, all batch sizes", _LABELS, registry=r)
        self.failure = Counter("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", (*_LABELS, "reason"), registry=r)
        self.count = Counter("nv_inference_count", "Number of inferences performed (a batch of n counts n)", _LABELS, registry=r)
        self.exec_count = Counter("nv_inference_exec_count", "Number of model executions performed (a batch counts once)", _LABELS, registry=r)
        self.request_duration = Counter("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (includes cached requests)", _LABELS, registry=r)
        self.queue_duration = Counter("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds", _LABELS, registry=r)
        self.compute_input_duration = Counter("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds", _LABELS, registry=r)
        self.compute_infer_duration = Counter("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds", _LABELS, registry=r)
        self.compute_output_duration = Counter("nv_inference_compute_output_duration_us", "Cumulative compute output duration in microseconds", _LABELS, registry=r)
        self.pending = Gauge("nv_inference_pending_request_count", "Instantaneous number of pending requests awaiting execution per-model", _LABELS, registry=r)
        self.load_duration = Gauge("nv_model_load_duration_secs", "Model load time in seconds", _LABELS, registry=r)

    def for_model(self, model: str, version: str) -> "ModelMetrics":
        return ModelMetrics(self, model, version)

    def forget(self, model: str, version: str) -> None:
        """Drop a model version's series when it is unloaded, as Triton does."""
        for metric in (self.success, self.count, self.exec_count, self.request_duration, self.queue_duration,
                       self.compute_input_duration, self.compute_infer_duration, self.compute_output_duration,
                       self.pending, self.load_duration):
            try:
                metric.remove(model, version)
            except KeyError:
                pass
        for labels in list(self.failure._metrics):  # noqa: SLF001 - no public way to list children
            if labels[:2] == (model, version):
                self.failure.remove(*labels)


class ModelMetrics:
    """Label children resolved once per model version: the hot path only adds numbers."""

    def __init__(self, m: ServerMetrics, model: str, version: str):
        labels = (model, version)
        self._m, self._labels = m, labels
        self.success = m.success.labels(*labels)
        self.count = m.count.labels(*labels)
        self.exec_count = m.exec_count.labels(*labels)
        self.request_duration = m.request_duration.labels(*labels)
        self.queue_duration = m.queue_duration.labels(*labels)
        self.compute_input = m.compute_input_duration.labels(*labels)
        self.compute_infer = m.compute_infer_duration.labels(*labels)
        self.compute_output = m.compute_output_duration.labels(*labels)
        self.pending = m.pending.labels(*labels)
        self.load_duration = m.load_duration.labels(*labels)

    def failure(self, reason: str) -> None:
        self._m.failure.labels(*self._labels, reason).inc()
