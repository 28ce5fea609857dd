"""Spans recorded on the request path, queued for export in a bounded buffer.

The recording is compiled (`_span_recorder.c`), or pure Python (`py_span_recorder`: same API and
records) where the extension was not built or `MODELPLEX_SPAN_RECORDER=python` asks for it (`c`
insists on the compiled one): a span is a small object; ending it copies one fixed-size record into
the `Recorder`'s buffer (dropped and counted when full). Names and attribute dicts the request path
reuses are registered once (`share`) and recorded by reference; a model that calls no other is
recorded inside its caller's record (`model_span`). Nothing here encodes, locks or calls
OpenTelemetry: the export (`trace_export`) takes records in bulk and `SpanDecoder` turns them back
into `SpanData` tuples, wherever the encoding happens.

A `SpanData` tuple: (trace_id, span_id, parent_span_id or 0, parent_is_remote, trace_state, name,
kind, start_ns, end_ns, attributes, events or None, status_code, status_message, children or None).
`kind` and `status_code` use OTLP's numbers; events are (time_ns, name, attributes). `children` are
child spans measured after the fact (a backend's prefill) as (name, start_ns, end_ns, attributes);
the queue and compute pair as one (None, enqueue_ns, start_ns, end_ns, batch_size); a model's span
added once done as (name, start_ns, end_ns, attributes, status_code, status_message, children).
They get their span ids at export (`expand_children`).
"""
from __future__ import annotations

import os
import random
import time
from contextvars import ContextVar

from .py_span_recorder import FLAG_MODEL, FLAG_REMOTE, RECORD

_ASKED = os.environ.get("MODELPLEX_SPAN_RECORDER", "")
if _ASKED not in ("", "c", "python"):
    raise ValueError(f"MODELPLEX_SPAN_RECORDER must be c, python or unset, not {_ASKED!r}")
SPAN_RECORDER = "python" if _ASKED == "python" else "c"  # the implementation in use
if SPAN_RECORDER == "c":
    try:
        from ._span_recorder import RECORD_SIZE, Recorder, SpanCore, share, shared
    except ImportError:
        if _ASKED == "c":
            raise
        SPAN_RECORDER = "python"  # installed where no compiler was: the extension is optional
if SPAN_RECORDER == "python":
    from .py_span_recorder import RECORD_SIZE, Recorder, SpanCore, share, shared  # noqa: F401 - re-exported

SPAN_KIND_INTERNAL, SPAN_KIND_SERVER = 1, 2  # OTLP Span.SpanKind
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2  # OTLP Status.StatusCode
assert RECORD.size == RECORD_SIZE  # `Record` in _span_recorder.c, laid out in py_span_recorder

_getrandbits = random.getrandbits
_time_ns = time.time_ns


class Span(SpanCore):
    """A span in progress (`SpanCore`: ids, times, `end`, `model_span`, `child`, `close` and `with`;
    here what the request path uses less often). A request's own: never shared across threads.

    `with span:` makes it the current span inside the block and ends it when the block leaves (with
    an error status if the block raised); a front door that entered it by hand ends it with `close`.
    """

    __slots__ = ()

    def phases(self, enqueue_ns: int, start_ns: int, end_ns: int, batch_size: int, backend_phases: list) -> None:
        """`queue` and `compute` children from perf-counter timestamps already taken, and the
        backend's own phases (`InferResponse.phases`, or None). Call before the span ends."""
        offset = self.recorder.clock_offset
        self._add_child((None, enqueue_ns + offset, start_ns + offset, end_ns + offset, batch_size))
        if backend_phases:
            self.backend_phases(backend_phases)

    def backend_phases(self, phases: list[tuple[str, int, int, dict]]) -> None:
        """A backend's own phases (`InferResponse.phases`, monotonic clock) as children."""
        offset = self.recorder.clock_offset
        for name, start, end, attributes in phases:
            self._add_child((name, start + offset, end + offset, attributes))

    def _model_child(self, name: str, attributes: dict, enqueue_ns: int, start_ns: int, end_ns: int, batch_size: int,
                     backend_phases: list | None) -> None:
        """`model_span` as a child tuple: a model with phases of its own, or a request's second model."""
        offset = self.recorder.clock_offset
        children = [(None, enqueue_ns + offset, start_ns + offset, end_ns + offset, batch_size)]
        children += [(n, start + offset, end + offset, a) for n, start, end, a in backend_phases or ()]
        self._add_child((name, enqueue_ns + offset, end_ns + offset, attributes, STATUS_UNSET, "", children))

    def model_span_failed(self, name: str, attributes: dict, start_ns: int, error: BaseException) -> None:
        """`model_span` for a model that failed (an error status) or was cancelled (none)."""
        offset = self.recorder.clock_offset
        if isinstance(error, Exception):
            status, message = STATUS_ERROR, f"{type(error).__name__}: {error}"
        else:
            status, message = STATUS_UNSET, ""
        self._add_child((name, start_ns + offset, time.perf_counter_ns() + offset, attributes, status, message, None))

    def _add_child(self, child: tuple) -> None:
        if self.children is None:
            self.children = [child]
        else:
            self.children.append(child)

    def set_attribute(self, key: str, value) -> None:
        self.attributes[key] = value

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


def new_recorder(max_size: int, batch_size: int) -> Recorder:
    """A buffer of at most `max_size` finished spans; `notify(count)` (set by the export) is called
    when the first span of a batch arrives (1) and when `batch_size` wait."""
    return Recorder(max_size, batch_size, Span, current_span)


class SpanDecoder:
    """`Recorder.take` batches -> `SpanData` tuples. Keeps the shared objects it was sent (a batch
    carries those registered since the one before)."""

    def __init__(self):
        self.shared: list = []

    def decode(self, batch: tuple) -> list[tuple]:
        shared_start, new_shared, records, extras_base, extras = batch
        table = self.shared
        del table[shared_start:]
        table += new_shared
        out = []
        for (trace_hi, trace_lo, span_id, parent_id, start, end, m_enqueue, m_start, m_end, m_batch, extra, name,
             attributes, m_name, m_attributes, status, kind, flags) in RECORD.iter_unpack(records):
            trace_id = trace_hi << 64 | trace_lo
            if extra < 0:
                x_name = x_attributes = state = message = events = children = x_m_name = x_m_attributes = None
            else:
                (x_name, x_attributes, state, message, events, children, x_m_name,
                 x_m_attributes) = extras[extra - extras_base]
            if flags & FLAG_MODEL:
                model = (table[m_name] if m_name >= 0 else x_m_name, m_enqueue, m_end,
                         table[m_attributes] if m_attributes >= 0 else x_m_attributes, STATUS_UNSET, "",
                         [(None, m_enqueue, m_start, m_end, m_batch)])
                children = [model, *children] if children else [model]
            out.append((trace_id, span_id, parent_id, bool(flags & FLAG_REMOTE), state or "",
                        table[name] if name >= 0 else x_name, kind, start, end,
                        table[attributes] if attributes >= 0 else x_attributes, events, status, message or "",
                        children))
        return out


def batch_size_of(batch: tuple) -> int:
    """The number of spans (records) in a `Recorder.take` batch."""
    return len(batch[2]) // RECORD_SIZE


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
