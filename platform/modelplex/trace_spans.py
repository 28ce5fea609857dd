"""Spans recorded on the request path as plain data, queued for export in a bounded buffer.

A span costs a few microseconds: ids from `random`, wall-clock nanoseconds, one context-variable
set while it is current, and, when it ends, one tuple appended to a deque. Nothing here encodes,
locks or calls OpenTelemetry: the export (`trace_export`) takes the tuples in bulk.

A finished span is a `SpanData` tuple (marshal-able, so it can cross a pipe as is):
(trace_id, span_id, parent_span_id or 0, parent_is_remote, trace_state, name, kind, start_ns,
end_ns, attributes, events or None, status_code, status_message, children or None). `kind` and
`status_code` use OTLP's numbers; events are (time_ns, name, attributes). `children` are child
spans measured after the fact (a backend's prefill) as (name, start_ns, end_ns, attributes); the
queue and compute pair as one (None, enqueue_ns, start_ns, end_ns, batch_size); a model's span added
once done (`Span.model_span`) as (name, start_ns, end_ns, attributes, status_code, status_message,
children). They get their span ids and attribute dicts at export (`expand_children`), and what a
request leaves in the buffer until then stays small: on `simple` over HTTP, spans kept until export
cost ~5 µs a request more than the same spans dropped at once.
"""
from __future__ import annotations

import random
import time
from collections import deque
from contextvars import ContextVar

SPAN_KIND_INTERNAL, SPAN_KIND_SERVER = 1, 2  # OTLP Span.SpanKind
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2  # OTLP Status.StatusCode

_getrandbits = random.getrandbits
_time_ns = time.time_ns
_new_span = object.__new__


class Span:
    """A span in progress; ending it queues its `SpanData`. A request's own: never shared across threads.

    `with span:` makes it the current span inside the block and ends it when the block leaves
    (with an error status if the block raised). Methods, not generators or helpers: every call
    counts on the request path.
    """

    __slots__ = ("buffer", "trace_id", "span_id", "parent_id", "parent_is_remote", "trace_state", "name", "kind",
                 "start_time", "attributes", "events", "status_code", "status_message", "children", "_token")

    def __init__(self, buffer: "SpanBuffer", name: str, trace_id: int, parent_id: int, parent_is_remote: bool,
                 trace_state: str, kind: int, attributes: dict):
        self.buffer, self.name, self.kind, self.attributes = buffer, name, kind, attributes
        self.trace_id, self.span_id = trace_id, _getrandbits(64) or 1
        self.parent_id, self.parent_is_remote, self.trace_state = parent_id, parent_is_remote, trace_state
        self.events = self.children = None
        self.status_code, self.status_message = STATUS_UNSET, ""
        self.start_time = _time_ns()

    def __enter__(self) -> "Span":
        self._token = current_span.set(self)
        return self

    def __exit__(self, kind, error, tb) -> None:
        current_span.reset(self._token)
        if error is not None and isinstance(error, Exception):
            self.status_code, self.status_message = STATUS_ERROR, f"{kind.__name__}: {error}"
        self.end()

    def end(self) -> None:
        """Queues the span (a span used with `with` ends by itself)."""
        buffer = self.buffer
        spans = buffer.spans
        n = len(spans)
        if n >= buffer.max_size:
            buffer.num_dropped += 1 + len(self.children or ())
            return
        spans.append((self.trace_id, self.span_id, self.parent_id, self.parent_is_remote, self.trace_state, self.name,
                      self.kind, self.start_time, _time_ns(), self.attributes, self.events, self.status_code,
                      self.status_message, self.children))
        if n == 0 or n + 1 == buffer.batch_size:
            buffer.notify(n + 1)

    def child(self, name: str, attributes: dict) -> "Span":
        """A new span under this one (enter it to make it current)."""
        span = _new_span(Span)  # fields set here: one call less than through __init__
        span.buffer, span.name, span.kind, span.attributes = self.buffer, name, SPAN_KIND_INTERNAL, attributes
        span.trace_id, span.span_id, span.parent_id = self.trace_id, _getrandbits(64) or 1, self.span_id
        span.parent_is_remote, span.trace_state = False, self.trace_state
        span.events = span.children = None
        span.status_code, span.status_message = STATUS_UNSET, ""
        span.start_time = _time_ns()
        return span

    def phases(self, enqueue_ns: int, start_ns: int, end_ns: int, batch_size: int, backend_phases: list) -> None:
        """`queue` and `compute` children from perf-counter timestamps already taken, and the
        backend's own phases (`InferResponse.phases`, or None). Call before the span ends."""
        offset = self.buffer.clocks.perf_counter
        entry = (None, enqueue_ns + offset, start_ns + offset, end_ns + offset, batch_size)
        if self.children is None:
            self.children = [entry]
        else:
            self.children.append(entry)
        if backend_phases:
            self.backend_phases(backend_phases)

    def backend_phases(self, phases: list[tuple[str, int, int, dict]]) -> None:
        """A backend's own phases (`InferResponse.phases`, monotonic clock) as children."""
        offset = self.buffer.clocks.monotonic
        if self.children is None:
            self.children = []
        self.children += [(name, start + offset, end + offset, attributes) for name, start, end, attributes in phases]

    def model_span(self, name: str, attributes: dict, enqueue_ns: int, start_ns: int, end_ns: int, batch_size: int,
                   backend_phases: list | None) -> None:
        """A child span, with its `queue` and `compute` pair and the backend's phases, for a model
        that calls no other (nothing can nest under it, so it is added once done, from its
        perf-counter times: it gets its span id at export). It ends when its compute does."""
        offset = self.buffer.clocks.perf_counter
        children = [(None, enqueue_ns + offset, start_ns + offset, end_ns + offset, batch_size)]
        if backend_phases:
            monotonic = self.buffer.clocks.monotonic
            children += [(n, start + monotonic, end + monotonic, a) for n, start, end, a in backend_phases]
        entry = (name, enqueue_ns + offset, end_ns + offset, attributes, STATUS_UNSET, "", children)
        if self.children is None:
            self.children = [entry]
        else:
            self.children.append(entry)

    def model_span_failed(self, name: str, attributes: dict, start_ns: int, error: BaseException) -> None:
        """`model_span` for a model that failed (an error status) or was cancelled (none)."""
        offset = self.buffer.clocks.perf_counter
        if isinstance(error, Exception):
            status, message = STATUS_ERROR, f"{type(error).__name__}: {error}"
        else:
            status, message = STATUS_UNSET, ""
        entry = (name, start_ns + offset, time.perf_counter_ns() + offset, attributes, status, message, None)
        if self.children is None:
            self.children = [entry]
        else:
            self.children.append(entry)

    def set_attribute(self, key: str, value) -> None:
        self.attributes[key] = value

    def set_status(self, code: int, message: str = "") -> None:
        self.status_code, self.status_message = code, message

    def add_event(self, name: str, attributes: dict) -> None:
        if self.events is None:
            self.events = []
        self.events.append((_time_ns(), name, attributes))

    def response_event(self, index: int, start_ns: int) -> None:
        """A streamed response went out: an event with the time since `start_ns` (perf counter);
        the first one's is the time to first response (`modelplex.ttft_ms`)."""
        elapsed_ms = (time.perf_counter_ns() - start_ns) / 1e6
        if index == 0:
            self.attributes["modelplex.ttft_ms"] = elapsed_ms
        self.add_event("response", {"index": index, "elapsed_ms": elapsed_ms})


# The span the running request is in, while a sampled request runs (a context variable: ensemble
# steps and BLS calls run in copies of their caller's context and see their caller's span). The
# request path of an untraced request pays one read of it per model.
current_span: ContextVar[Span | None] = ContextVar("modelplex_current_span", default=None)


class ClockOffsets:
    """Nanoseconds to add to `perf_counter_ns` / `monotonic_ns` readings (what the request path
    measures) to get wall-clock time (what OTLP carries). Read often, refreshed by the export when
    a batch starts and after each send: the clocks drift apart slowly (NTP slews the wall clock), and
    a phase measured with an offset gone stale over a long idle time is still clamped into its parent."""

    def __init__(self):
        self.refresh()

    def refresh(self) -> None:
        self.perf_counter = time.time_ns() - time.perf_counter_ns()
        self.monotonic = time.time_ns() - time.monotonic_ns()


class SpanBuffer:
    """Finished spans waiting for export: at most `max_size`; beyond that a span is dropped and
    counted (a slow export never makes a request wait or grow memory)."""

    def __init__(self, max_size: int, batch_size: int):
        self.max_size, self.batch_size = max_size, batch_size
        self.spans: deque[tuple] = deque()
        self.num_dropped = 0
        self.clocks = ClockOffsets()

    def notify(self, count: int) -> None:
        """Called with the number of spans waiting when the first one of a batch arrives (1) and
        when a full batch waits (`batch_size`); the export replaces it."""

    def take(self, limit: int) -> list[tuple]:
        """Up to `limit` spans, oldest first."""
        spans = self.spans
        return [spans.popleft() for _ in range(min(limit, len(spans)))]


def expand_children(spans: list[tuple]) -> list[tuple]:
    """`SpanData` with children -> the spans and their children (and theirs) as `SpanData` of their
    own (13 fields, no children), each child with a new span id."""
    out = []
    for s in spans:
        out.append(s[:13])
        if s[13]:
            _expand(out, s[13], s[0], s[1], s[4], s[7], s[8])
    return out


def _expand(out: list, children: list, trace_id: int, parent_id: int, trace_state: str, floor: int,
            ceiling: int) -> None:
    for child in children:
        if child[0] is None:  # the queue and compute pair
            _, enqueue, start, end, batch_size = child
            _expand(out, (("queue", enqueue, start, {}), ("compute", start, end, {"modelplex.batch_size": batch_size})),
                    trace_id, parent_id, trace_state, floor, ceiling)
            continue
        # Inside the parent: clocks read microseconds apart may disagree by as much.
        start = min(max(child[1], floor), ceiling)
        end = min(max(child[2], start), ceiling)
        span_id = _getrandbits(64) or 1
        recorded = len(child) > 4  # a model span's (`Span.model_span`): status and children of its own
        out.append((trace_id, span_id, parent_id, False, trace_state, child[0], SPAN_KIND_INTERNAL, start, end,
                    child[3], None, child[4] if recorded else STATUS_UNSET, child[5] if recorded else ""))
        if recorded and child[6]:
            _expand(out, child[6], trace_id, span_id, trace_state, start, end)
