"""Request tracing: Triton's trace settings, sampling at the front doors, and asynchronous, bounded
OTLP export (OpenTelemetry's wire format and W3C trace context).

A front door asks `Tracing.sample` only when `Tracing.enabled` and opens `request_span` for a
sampled request; inside it the span is `trace_spans.current_span`, and the rest of the path (model
versions, ensemble steps, BLS calls, streams) adds children to whatever span is current: an
untraced request pays one context-variable read per model. Spans are recorded in C (or Python where
that was not built) as plain records (`trace_spans`); encoding and export happen in another process
(`trace_export`, `otlp_exporter`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from ..core.errors import InvalidInput
from ..core.params import parse_int
from ..core.trace_config import TraceConfig, trace_level
from .trace_export import ExporterProcess, LoopExport, SdkExporterSink
from .trace_spans import Recorder, Span, new_recorder

log = logging.getLogger(__name__)

UPDATABLE = ("trace_level", "trace_rate", "trace_count")
FIXED = ("log_frequency", "trace_file", "trace_mode")  # reported, not changeable here
SPANS_PER_REQUEST = 4  # a traced request's usual spans: server, model, queue, compute
HANDOFF_REQUESTS = 64  # the most requests the event loop hands the exporter at once


@dataclass
class _Sampler:
    """One set of effective settings and its counters (Triton: every rate-th request, count traces)."""

    level: str
    rate: int
    count: int
    seen: int = 0

    def take(self) -> bool:
        if self.level == "OFF" or self.count == 0:
            return False
        self.seen += 1
        if self.seen % self.rate:
            return False
        if self.count > 0:
            self.count -= 1
        return True


class Tracing:
    """A server's trace settings (global plus per-model overrides) and its OpenTelemetry provider.

    Invariant: `enabled` is True exactly when the global level or some model's level is not OFF.
    """

    def __init__(self, config: TraceConfig | None = None, exporter=None):
        self.config = config or TraceConfig()
        self._exporter = exporter  # None: OTLP over HTTP to config.url
        self._global = _Sampler(self.config.level, self.config.rate, self.config.count)
        self._models: dict[str, dict] = {}  # model -> its overridden settings
        self._samplers: dict[str, _Sampler] = {}
        self._buffer: Recorder | None = None
        self._export: LoopExport | None = None
        self.enabled = False
        self._refresh()

    # ---- settings (Triton's /v2/trace/setting JSON) --------------------------------------
    def settings(self, model: str = "") -> dict:
        s = self._samplers.get(model, self._global) if model else self._global
        return {"trace_level": [s.level], "trace_rate": str(s.rate), "trace_count": str(s.count),
                "log_frequency": "0", "trace_file": "", "trace_mode": "opentelemetry"}

    def update(self, changes: dict, model: str = "") -> dict:
        """Apply `changes` (a value of None clears a model's override); unknown keys are refused."""
        parsed = {}
        for key, value in changes.items():
            if key in FIXED:
                raise InvalidInput(f"trace setting '{key}' cannot be changed (mode opentelemetry exports over OTLP)")
            if key not in UPDATABLE:
                raise InvalidInput(f"unknown trace setting '{key}' (expected one of {', '.join(UPDATABLE)})")
            parsed[key] = None if value is None else _parse_setting(key, value)
        if model:
            override = self._models.setdefault(model, {})
            for key, value in parsed.items():
                if value is None:
                    override.pop(key, None)
                else:
                    override[key] = value
        else:
            defaults = {"trace_level": self.config.level, "trace_rate": self.config.rate,
                        "trace_count": self.config.count}
            for key, value in parsed.items():
                setattr(self._global, key.removeprefix("trace_"), defaults[key] if value is None else value)
            self._global.seen = 0
        self._refresh()
        return self.settings(model)

    def _refresh(self) -> None:
        g = self._global
        self._samplers = {
            model: _Sampler(o.get("trace_level", g.level), o.get("trace_rate", g.rate), o.get("trace_count", g.count))
            for model, o in self._models.items() if o}
        self.enabled = g.level != "OFF" or any(s.level != "OFF" for s in self._samplers.values())
        if self.enabled and self._export is None:
            self._start_export()

    # ---- export ---------------------------------------------------------------------------
    def _start_export(self) -> None:
        c = self.config
        batch_size = min(c.bsp_max_export_batch_size, c.bsp_max_queue_size)
        # The queue holds records (a request's server span with its model span inline; any other span with
        # its children); the exporter process posts up to `batch_size` spans at once. The loop hands it at
        # most HANDOFF_REQUESTS records at a time: in-process (tracing_cost.py), hand-offs of 16 cost a
        # traced request ~1 µs more than 64, and 128 or 256 no less than 64. (When spans waited as Python
        # tuples, larger hand-offs cost more over sockets: the data was cold by the time it was marshalled.)
        requests_per_batch = max(1, min(HANDOFF_REQUESTS, batch_size // SPANS_PER_REQUEST))
        self._buffer = new_recorder(c.bsp_max_queue_size, requests_per_batch)
        if self._exporter is None:
            sink = ExporterProcess(c.url, c.resource, batch_size)
        else:
            sink = SdkExporterSink(self._exporter, c.resource)
        self._export = LoopExport(self._buffer, sink, c.bsp_schedule_delay_ms / 1000, requests_per_batch)
        log.info("tracing on: OTLP export to %s", c.url if self._exporter is None else "the given exporter")

    @property
    def num_dropped(self) -> int:
        """Spans dropped because the export could not keep up (or the exporter was down)."""
        return self._export.num_dropped if self._export is not None else 0

    def flush(self) -> None:
        if self._export is not None:
            self._export.flush()

    def shutdown(self, timeout: float = 2.0) -> None:
        """Export what is still queued, for at most about `timeout` s: a hung collector must not hold the exit."""
        if self._export is not None:
            self._export.stop(timeout)

    # ---- spans ----------------------------------------------------------------------------
    def sample(self, model: str) -> bool:
        """Whether to trace this request (front doors ask once per request, on the event loop)."""
        return self._samplers.get(model, self._global).take()

    def request_span(self, name: str, attributes: dict, headers) -> Span:
        """A front door's server span for one sampled request (`with` it, or enter it and `close`
        it), child of the client's `traceparent` among `headers` ((name, value) pairs: ASGI's bytes
        or gRPC metadata's str) when that is valid, else the root of a new trace."""
        return self._buffer.server_span(name, attributes, headers)


def _parse_setting(key: str, value):
    if key == "trace_level":
        return trace_level(value if isinstance(value, list) else [value])
    return parse_int(value, key, minimum=1 if key == "trace_rate" else -1)
