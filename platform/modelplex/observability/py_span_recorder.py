"""The span recorder in pure Python: `_span_recorder.c`'s API and record format, used where the C extension
was not built (no compiler at install) or `MODELPLEX_SPAN_RECORDER=python` asks for it (`trace_spans` picks).

The semantics are the C file's, documented there: a span's end appends one fixed-size record (`RECORD`,
112 bytes) to a bounded queue, or drops and counts it when the queue is full; shared names and attribute
dicts (`share`) are recorded as indices into one table for the process, anything else as one extras tuple;
`take` hands the export batches that `SpanDecoder` cannot tell from the C recorder's. Differences: span and
trace ids come from `random` (reseeded after a fork) instead of xorshift128+, and read-only fields of the C
types are plain attributes here. Not thread-safe, as the C one is not: a request's spans live on its loop.

Cost: tracing a `simple` request costs ~14 µs of CPU with it against ~4 µs with the C recorder
(benchmarks/tracing_cost.py, 6 pairs of 8,000 requests on a shared 2-core machine); a server span with an
inline model span, from `server_span` to `close`, takes ~5.4 µs against ~1.2 µs.
"""
from __future__ import annotations

import operator
import random
import re
import struct
import time
from contextvars import ContextVar

# `Record` in _span_recorder.c: trace id (high, low), span id, parent id; start, end, the model span's
# enqueue/start/end and batch size, the extras' sequence number; name, attributes, model name, model
# attributes (shared references, -1: in the extras); status, kind, flags.
RECORD = struct.Struct("<4Q7q4i3B5x")
RECORD_SIZE = RECORD.size
_EXTRA_OF = struct.Struct("<80xq24x")  # a record's extras sequence number, alone
FLAG_REMOTE, FLAG_MODEL = 1, 2
MAX_SHARED = 4096  # shared objects at most; later ones are recorded in the extras
_KIND_INTERNAL, _KIND_SERVER, _STATUS_ERROR = 1, 2, 2
_MASK64 = (1 << 64) - 1
_NO_MODEL = (0, 0, 0, 0)
_ABSENT = object()  # a header not seen yet (its value may be anything, None included)
# W3C traceparent's fixed part after optional blanks: version, trace id, parent id, flags (lowercase hex).
_TRACEPARENT = re.compile(r"[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")

_getrandbits = random.getrandbits
_time_ns = time.time_ns
_pack = RECORD.pack

# The shared objects, one table for the process (model versions register theirs without knowing which server
# traces them): `shared` (index = the reference in records) and their indices by identity (`shared` keeps them
# alive, so no other object can have their id).
shared: list = []
_shared_index: dict[int, int] = {}


def share(obj):
    """share(obj) -> obj: registers `obj` (a name, or an attributes dict never changed again) to be recorded
    by reference. At most MAX_SHARED in a process; later ones are recorded in full."""
    if id(obj) not in _shared_index and len(shared) < MAX_SHARED:
        _shared_index[id(obj)] = len(shared)
        shared.append(obj)
    return obj


def _new_id() -> int:
    return _getrandbits(64) or 1


class Recorder:
    """Finished spans' records, oldest first, at most `max_size`; `notify(count)` is called when the first
    record of a batch (1) or a full batch (`batch_size`) waits."""

    __slots__ = ("max_size", "batch_size", "num_dropped", "notify", "_span_type", "_current", "_records", "_extras",
                 "_extras_base", "_shared_taken", "_clock_offset")

    def __init__(self, max_size: int, batch_size: int, span_type: type, current: ContextVar):
        if not (isinstance(span_type, type) and issubclass(span_type, SpanCore)):
            raise TypeError("span_type must subclass SpanCore")
        if not isinstance(current, ContextVar):
            raise TypeError("current must be a ContextVar")
        if max_size < 0 or batch_size < 1:
            raise ValueError("max_size must be >= 0 and batch_size >= 1")
        self.max_size, self.batch_size = operator.index(max_size), operator.index(batch_size)
        self.num_dropped = 0
        self.notify = None
        self._span_type, self._current = span_type, current
        self._records: list[bytes] = []  # queued records, each RECORD_SIZE bytes
        self._extras: list[tuple] = []  # extras tuples of queued records, oldest first
        self._extras_base = 0  # sequence number of _extras[0]
        self._shared_taken = 0  # shared objects already handed to the export
        self._clock_offset = _time_ns() - time.monotonic_ns()

    @property
    def pending(self) -> int:
        """Records waiting for export."""
        return len(self._records)

    @property
    def clock_offset(self) -> int:
        """Wall clock minus perf counter, in ns (refreshed by the export)."""
        return self._clock_offset

    def refresh_clocks(self) -> None:
        self._clock_offset = _time_ns() - time.monotonic_ns()

    def take(self, limit: int) -> tuple | None:
        """Up to `limit` records, oldest first: (shared_start, new shared objects, records, extras_base,
        extras), or None when nothing is queued."""
        n = min(operator.index(limit), len(self._records))
        if n <= 0:
            return None
        records = b"".join(self._records[:n])
        num_extras = sum(extra >= 0 for (extra,) in _EXTRA_OF.iter_unpack(records))
        batch = (self._shared_taken, shared[self._shared_taken:], records, self._extras_base,
                 self._extras[:num_extras])
        del self._extras[:num_extras], self._records[:n]
        self._shared_taken = len(shared)
        self._extras_base += num_extras
        return batch

    def server_span(self, name, attributes, headers) -> SpanCore:
        """A front door's span for a sampled request, child of the client's `traceparent` among `headers`
        ((name, value) pairs, bytes or str) when valid."""
        traceparent = tracestate = _ABSENT
        for pair in headers:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                continue  # not a (name, value) pair
            key = pair[0]
            # Equal to a name first (cheap, and false for nearly every header), then of a type that counts.
            if key == b"traceparent" or key == "traceparent":
                if traceparent is _ABSENT and isinstance(key, (bytes, str)):
                    traceparent = pair[1]
            elif key == b"tracestate" or key == "tracestate":
                if tracestate is _ABSENT and isinstance(key, (bytes, str)):
                    tracestate = pair[1]
        span = _new_span(self._span_type, self, name, attributes, _KIND_SERVER)
        parent = None if traceparent is _ABSENT else _parse_traceparent(_as_str(traceparent))
        if parent is None:
            span._trace_id = _new_id() << 64 | _new_id()
        else:
            span._trace_id, span.parent_id = parent
            span._remote = True
            state = _as_str(tracestate)
            if state is not None:
                span._trace_state = ",".join(p.strip() for p in state.split(",") if "=" in p)
        return span


class SpanCore:
    """A span in progress: ids, times, `end`, `model_span`, `child`, `close` and `with`. Fields the C type
    keeps private start with `_`; `_m_*` are set once `_has_model` is."""

    __slots__ = ("recorder", "name", "attributes", "events", "children", "status_message", "status_code",
                 "span_id", "parent_id", "start_time", "_trace_id", "_trace_state", "_kind", "_remote", "_token",
                 "_has_model", "_m_name", "_m_attributes", "_m_times")

    def __init__(self, recorder: Recorder, name, trace_id: int, parent_id: int, parent_is_remote: bool,
                 trace_state: str, kind: int, attributes):
        if not isinstance(recorder, Recorder) or not isinstance(trace_state, str):
            raise TypeError("Span(recorder, name, trace_id, parent_id, parent_is_remote, trace_state, kind, "
                            "attributes)")
        if not 0 <= parent_id <= _MASK64:
            raise OverflowError("parent_id must fit in 64 bits")
        _init_span(self, recorder, name, attributes, kind)
        self._trace_id = trace_id & ((1 << 128) - 1)
        self.parent_id = parent_id
        self._remote = bool(parent_is_remote)
        self._trace_state = trace_state

    @property
    def trace_id(self) -> int:
        return self._trace_id

    @property
    def trace_state(self) -> str:
        return self._trace_state or ""

    def end(self) -> None:
        """Queues the span's record (a span used with `with` ends by itself); dropped and counted when the
        buffer is full."""
        r = self.recorder
        records = r._records
        has_model = self._has_model
        if len(records) >= r.max_size:
            r.num_dropped += 1 + has_model + (len(self.children) if self.children else 0)
            return
        ref = _shared_index.get
        name, attributes = ref(id(self.name), -1), ref(id(self.attributes), -1)
        if has_model:
            m_name, m_attributes, model = ref(id(self._m_name), -1), ref(id(self._m_attributes), -1), self._m_times
        else:
            m_name = m_attributes = 0
            model = _NO_MODEL
        state, message, events, children = self._trace_state, self.status_message, self.events, self.children
        extra = -1
        # As the C recorder's is_set: None and "" are unset, anything else (an empty list too) is set.
        if (name < 0 or attributes < 0 or m_name < 0 or m_attributes < 0 or (state is not None and state != "")
                or (message is not None and message != "") or (events is not None and events != "")
                or (children is not None and children != "")):
            extra = r._extras_base + len(r._extras)
            extras = (self.name if name < 0 else None, self.attributes if attributes < 0 else None, state, message,
                      events, children, self._m_name if m_name < 0 else None,
                      self._m_attributes if m_attributes < 0 else None)
        trace_id = self._trace_id
        # Packed before anything is appended: a field out of range leaves the queue as it was.
        record = _pack(trace_id >> 64, trace_id & _MASK64, self.span_id, self.parent_id, self.start_time, _time_ns(),
                       *model, extra, name, attributes, m_name, m_attributes, self.status_code & 0xFF,
                       self._kind & 0xFF, (FLAG_REMOTE if self._remote else 0) | (FLAG_MODEL if has_model else 0))
        if extra >= 0:
            r._extras.append(extras)
        records.append(record)
        waiting = len(records)
        if (waiting == 1 or waiting == r.batch_size) and r.notify is not None:
            r.notify(waiting)

    def __enter__(self):
        self._token = self.recorder._current.set(self)
        return self

    def _reset_current(self) -> None:
        if self._token is not None:
            self.recorder._current.reset(self._token)
            self._token = None

    def __exit__(self, exc_type, exc, traceback) -> bool:
        self._reset_current()
        if exc is not None and isinstance(exc, Exception):
            self.status_message = f"{exc_type.__name__}: {exc}"
            self.status_code = _STATUS_ERROR
        self.end()
        return False

    def close(self, attributes, status_code: int) -> None:
        """A front door's end of a span it entered: the context variable back, the attributes (None: keep)
        and status set, the span ended."""
        if self._token is not None:
            self.recorder._current.reset(self._token)
            self._token = None
        if attributes is not None:
            self.attributes = attributes
        self.status_code = status_code
        self.end()

    def child(self, name, attributes) -> SpanCore:
        """A new span under this one (enter it to make it current)."""
        span = _new_span(type(self), self.recorder, name, attributes, _KIND_INTERNAL)
        span._trace_id = self._trace_id
        span.parent_id = self.span_id
        span._trace_state = self._trace_state
        return span

    def model_span(self, name, attributes, enqueue_ns: int, start_ns: int, end_ns: int, batch_size: int,
                   backend_phases) -> None:
        """A model that calls no other, added once done from its perf-counter times. The first one without
        phases goes into the record itself; others as children tuples (`Span._model_child`)."""
        if self._has_model or backend_phases:
            return self._model_child(name, attributes, enqueue_ns, start_ns, end_ns, batch_size, backend_phases)
        offset = self.recorder._clock_offset
        self._m_name, self._m_attributes = name, attributes
        self._m_times = (enqueue_ns + offset, start_ns + offset, end_ns + offset, batch_size)
        self._has_model = True

    def set_status(self, code: int, message=_ABSENT) -> None:
        self.status_code = code
        if message is not _ABSENT:
            self.status_message = message


def _init_span(span: SpanCore, recorder: Recorder, name, attributes, kind: int) -> None:
    span.recorder, span.name, span.attributes, span._kind = recorder, name, attributes, kind
    span.span_id, span.start_time = _new_id(), _time_ns()
    span.parent_id = span.status_code = 0
    span._remote = span._has_model = False
    span._trace_state = span.status_message = span.events = span.children = span._token = None


def _new_span(span_type: type, recorder: Recorder, name, attributes, kind: int) -> SpanCore:
    """A span of `span_type` without its `__init__` (as the C type allocates one); the caller sets the trace."""
    span = object.__new__(span_type)
    _init_span(span, recorder, name, attributes, kind)
    return span


def _as_str(value) -> str | None:
    """ASGI's bytes (latin-1) or gRPC metadata's str; None for anything else (binary metadata, absent)."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value if isinstance(value, str) else None


def _parse_traceparent(value: str | None) -> tuple[int, int] | None:
    """A valid `traceparent` (W3C: version 00 exactly, or a later one with optional `-` fields on the line)
    -> (trace id, parent id); None when absent or invalid (the request starts a new trace)."""
    match = _TRACEPARENT.match(value) if value is not None else None
    if match is None or match[1] == "ff":
        return None
    rest = value[match.end():]
    if rest.strip(" \t") and (match[1] == "00" or rest[0] != "-" or "\n" in rest):
        return None
    trace_id, parent_id = int(match[2], 16), int(match[3], 16)
    return (trace_id, parent_id) if trace_id and parent_id else None
