"""Request tracing with OpenTelemetry: Triton's trace settings, sampling at the front doors, spans
along the request path, and asynchronous, bounded OTLP export.

A front door asks `Tracing.sample` only when `Tracing.enabled` and opens `request_span` for a sampled
request, which then carries its `Tracing` in the `active_trace` context variable: the rest of the
path (model versions, the batcher, ensemble steps, BLS calls) pays one context-variable read when
tracing is off. Phases measured anyway (queue, compute) become spans after the fact from their
perf-counter timestamps. A streamed request gets a span with one event per response and its time to
first response (TTFT); an engine adds its own phases (prefill) as child spans of the current span.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .errors import InvalidInput
from .trace_spans import SpanRecorder

log = logging.getLogger(__name__)

# The Tracing of the request being served, set only while a sampled request runs.
active_trace: ContextVar["Tracing | None"] = ContextVar("modelplex_active_trace", default=None)

LEVELS = ("OFF", "TIMESTAMPS")
UPDATABLE = ("trace_level", "trace_rate", "trace_count")
FIXED = ("log_frequency", "trace_file", "trace_mode")  # reported, not changeable here
_PROPAGATOR = TraceContextTextMapPropagator()


@dataclass
class TraceConfig:
    """`--trace-config` as Triton spells it: level/rate/count/mode, and `opentelemetry,<key>=<value>`."""

    level: str = "OFF"
    rate: int = 1000
    count: int = -1
    url: str = "http://localhost:4318/v1/traces"
    resource: dict[str, str] = field(default_factory=lambda: {"service.name": "modelplex"})
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay_ms: int = 5000
    bsp_max_export_batch_size: int = 512

    @classmethod
    def parse(cls, items: list[str]) -> "TraceConfig":
        config = cls()
        for item in items:
            section, _, setting = item.rpartition(",")
            key, sep, value = setting.partition("=")
            if not sep:
                raise InvalidInput(f"--trace-config {item!r}: expected <setting>=<value>")
            if section not in ("", "opentelemetry"):
                raise InvalidInput(f"--trace-config {item!r}: only the 'opentelemetry' mode is supported")
            config._set(section, key, value, item)
        return config

    def _set(self, section: str, key: str, value: str, item: str) -> None:
        if not section and key == "mode":
            if value != "opentelemetry":
                raise InvalidInput(f"--trace-config {item!r}: only mode=opentelemetry is supported")
        elif not section and key == "level":
            self.level = _level([value])
        elif not section and key in ("rate", "count"):
            setattr(self, key, _integer(value, key, minimum=1 if key == "rate" else -1))
        elif section and key == "url":
            self.url = value
        elif section and key == "resource":
            name, sep, resource_value = value.partition("=")
            if not sep:
                raise InvalidInput(f"--trace-config {item!r}: expected resource=<key>=<value>")
            self.resource[name] = resource_value
        elif section and key in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
            attr = "bsp_schedule_delay_ms" if key == "bsp_schedule_delay" else key
            setattr(self, attr, _integer(value, key, minimum=1))
        else:
            raise InvalidInput(f"--trace-config {item!r}: unknown setting '{key}'")


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
        self._provider = self._tracer = self._recorder = None
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
        if self.enabled and self._tracer is None:
            self._start_provider()

    # ---- export ---------------------------------------------------------------------------
    def _start_provider(self) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        exporter = self._exporter
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=self.config.url, timeout=5)
        c = self.config
        # Spans wait in a bounded queue for a background thread: a slow or dead collector drops
        # spans once the queue is full and never delays a request.
        processor = BatchSpanProcessor(exporter, max_queue_size=c.bsp_max_queue_size,
                                       schedule_delay_millis=c.bsp_schedule_delay_ms,
                                       max_export_batch_size=min(c.bsp_max_export_batch_size, c.bsp_max_queue_size))
        # A full queue drops spans by design; the SDK would log a warning for every span dropped.
        logging.getLogger("opentelemetry.sdk._shared_internal").setLevel(logging.ERROR)
        # shutdown_on_exit=False: the SDK's exit hook would wait for a hung collector; Server.stop
        # calls `shutdown`, which does not.
        self._provider = TracerProvider(resource=Resource.create(c.resource), shutdown_on_exit=False)
        self._provider.add_span_processor(processor)
        self._recorder = SpanRecorder(processor, self._provider.resource, InstrumentationScope("modelplex"))
        self._tracer = self._provider.get_tracer("modelplex")
        log.info("tracing on: OpenTelemetry export to %s", c.url if self._exporter is None else "the given exporter")

    def flush(self, timeout_ms: int = 5000) -> bool:
        return self._provider.force_flush(timeout_ms) if self._provider is not None else True

    def shutdown(self, timeout: float = 2.0) -> None:
        """Export what is still queued, for at most `timeout` s: a hung collector must not hold the exit."""
        if self._provider is not None:
            worker = threading.Thread(target=self._provider.shutdown, name="trace-shutdown", daemon=True)
            worker.start()
            worker.join(timeout)

    # ---- spans ----------------------------------------------------------------------------
    def sample(self, model: str) -> bool:
        """Whether to trace this request (front doors ask once per request, on the event loop)."""
        return self._samplers.get(model, self._global).take()

    @contextlib.contextmanager
    def request_span(self, name: str, carrier: dict, attributes: dict):
        """A front door's server span around one sampled request, child of the client's `traceparent`."""
        remote = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context() if carrier else None
        token = active_trace.set(self)
        try:
            with self._recorder.current(name, remote or trace.INVALID_SPAN_CONTEXT, trace.SpanKind.SERVER,
                                        attributes) as span:
                yield span
        finally:
            active_trace.reset(token)

    def span(self, name: str, attributes: dict):
        """A child of the current span (a model, an ensemble step), current while it runs."""
        return self._recorder.current(name, None, trace.SpanKind.INTERNAL, attributes)

    def stream_span(self, name: str, attributes: dict):
        """A streamed request's span (ended by the caller); `response_event` marks each response."""
        return self._tracer.start_span(name, attributes=attributes)

    @staticmethod
    def response_event(span, index: int, start_ns: int) -> None:
        elapsed_ms = (time.perf_counter_ns() - start_ns) / 1e6
        if index == 0:
            span.set_attribute("modelplex.ttft_ms", elapsed_ms)
        span.add_event("response", {"index": index, "elapsed_ms": elapsed_ms})

    def phases(self, parent, enqueue_ns: int, start_ns: int, end_ns: int, batch_size: int) -> None:
        """`queue` and `compute` spans under `parent` from perf-counter timestamps already taken."""
        # perf_counter_ns (what the request path measures) -> epoch ns (what OTLP carries), taken
        # now (the clocks drift apart) and kept inside the parent, which began on the epoch clock.
        offset = time.time_ns() - time.perf_counter_ns()
        floor = parent.start_time
        record = self._recorder.finished
        record("queue", parent.context, max(floor, enqueue_ns + offset), max(floor, start_ns + offset), {})
        record("compute", parent.context, max(floor, start_ns + offset), max(floor, end_ns + offset),
               {"modelplex.batch_size": batch_size})


def headers_carrier(headers) -> dict:
    """The W3C trace context among (name, value) pairs: ASGI's bytes or gRPC metadata's str."""
    carrier = {}
    for key, value in headers:
        key = key.decode("latin-1") if isinstance(key, bytes) else key
        if key in ("traceparent", "tracestate"):
            carrier[key] = value.decode("latin-1") if isinstance(value, bytes) else value
    return carrier


def _parse_setting(key: str, value):
    if key == "trace_level":
        return _level(value if isinstance(value, list) else [value])
    return _integer(value, key, minimum=1 if key == "trace_rate" else -1)


def _level(values: list) -> str:
    if not values or any(type(v) is not str or v.upper() not in LEVELS for v in values):
        raise InvalidInput(f"trace_level must be a list of {' or '.join(LEVELS)}, got {values!r}")
    levels = {v.upper() for v in values}
    return "TIMESTAMPS" if "TIMESTAMPS" in levels else "OFF"


def _integer(value, key: str, minimum: int) -> int:
    try:
        number = int(value) if type(value) in (int, str) else None
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise InvalidInput(f"{key} must be an integer >= {minimum}, got {value!r}")
    return number
