"""Spans measured on the request path and handed to OpenTelemetry's export queue once they end.

The SDK's live spans (locks, sampler, attribute limits, a span processor call at start) cost ~35 µs
each here; a request's spans are all created by us, sampled already and never shared across
threads, so we record them as plain objects and give the `BatchSpanProcessor` finished
`ReadableSpan`s, which export exactly like the SDK's own.
"""
from __future__ import annotations

import contextlib
import random
import time

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class RecordedSpan:
    """A span in progress: what `set_attribute`/`set_status` change is exported when it ends."""

    __slots__ = ("name", "context", "parent", "kind", "attributes", "start_time", "status")

    def __init__(self, name: str, context: SpanContext, parent: SpanContext | None, kind: SpanKind,
                 attributes: dict, start_time: int):
        self.name, self.context, self.parent, self.kind = name, context, parent, kind
        self.attributes, self.start_time, self.status = attributes, start_time, Status(StatusCode.UNSET)

    def get_span_context(self) -> SpanContext:
        return self.context

    def set_attribute(self, key: str, value) -> None:
        self.attributes[key] = value

    def set_status(self, code: StatusCode, description: str | None = None) -> None:
        self.status = Status(code, description)


class SpanRecorder:
    """Makes `RecordedSpan`s and sends them, finished, to `processor` (a BatchSpanProcessor)."""

    def __init__(self, processor, resource, scope):
        self.processor, self.resource, self.scope = processor, resource, scope

    @contextlib.contextmanager
    def current(self, name: str, parent: SpanContext | None, kind: SpanKind, attributes: dict):
        """A span that is the current span (the parent of nested ones) while the block runs; `parent`
        None: a child of the current span, or a new trace's root."""
        if parent is None:
            parent = trace.get_current_span().get_span_context()
        if not parent.is_valid:
            parent = None
        trace_id = parent.trace_id if parent is not None else random.getrandbits(128) or 1
        span = RecordedSpan(name, SpanContext(trace_id, random.getrandbits(64) or 1, False, _SAMPLED), parent,
                            kind, attributes, time.time_ns())
        token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(span.context)))
        try:
            yield span
        except Exception as e:
            span.set_status(StatusCode.ERROR, f"{type(e).__name__}: {e}")
            raise
        finally:
            otel_context.detach(token)
            self.end(span, time.time_ns())

    def end(self, span: RecordedSpan, end_time: int) -> None:
        self.processor.on_end(ReadableSpan(
            span.name, span.context, span.parent, self.resource, span.attributes, kind=span.kind, status=span.status,
            start_time=span.start_time, end_time=end_time, instrumentation_scope=self.scope))

    def finished(self, name: str, parent: SpanContext, start_time: int, end_time: int, attributes: dict) -> None:
        """A span measured already (queue, compute), as a child of `parent`."""
        context = SpanContext(parent.trace_id, random.getrandbits(64) or 1, False, _SAMPLED)
        self.end(RecordedSpan(name, context, parent, SpanKind.INTERNAL, attributes, start_time), end_time)
