"""The span recorder in use (the compiled one; `py_span_recorder` when test_py_span_recorder reruns this module
with MODELPLEX_SPAN_RECORDER=python): W3C trace context read as the specification says, records that decode
back to exactly what was recorded, a bounded buffer, and an exporter process that gets the shared objects again
when it is restarted."""
from __future__ import annotations

import random
import re
import time

import pytest
from helpers.otlp_receiver import receiver

from modelplex.observability import trace_export
from modelplex.observability.trace_export import ExporterProcess
from modelplex.observability.trace_spans import (
    SPAN_KIND_INTERNAL,
    SPAN_KIND_SERVER,
    STATUS_ERROR,
    STATUS_UNSET,
    SpanDecoder,
    current_span,
    new_recorder,
    share,
)

# W3C Trace Context, level 1 (version 00 exactly; a later version may carry more fields), as a regex.
TRACEPARENT = re.compile(r"[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?[ \t]*")
VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def expected_parent(traceparent: str, tracestate: str | None) -> tuple[int, int, str] | None:
    match = TRACEPARENT.fullmatch(traceparent)
    if match is None or match[1] == "ff" or (match[1] == "00" and match[5]):
        return None
    trace_id, span_id = int(match[2], 16), int(match[3], 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, ",".join(p.strip() for p in (tracestate or "").split(",") if "=" in p)


def mutations(rng: random.Random):
    alphabet = "0123456789abcdefABCDEF- \t\n,=xz"
    for _ in range(3000):
        chars = list(VALID)
        for _ in range(rng.randint(1, 3)):
            op, at = rng.randrange(3), rng.randrange(len(chars) + 1)
            if op == 0 and at < len(chars):
                chars[at] = rng.choice(alphabet)
            elif op == 1:
                chars.insert(at, rng.choice(alphabet))
            elif at < len(chars):
                del chars[at]
        yield "".join(chars)


CASES = [VALID, f"  {VALID}\t", f"{VALID}-", f"{VALID}-extra", "01-" + VALID[3:] + "-more-fields", "01-" + VALID[3:] + "-a\nb",
         "ff-" + VALID[3:], "00-" + "0" * 32 + VALID[35:], VALID[:36] + "0" * 16 + "-01", VALID.upper(), VALID[:-1], "",
         f"{VALID} x", "01-" + VALID[3:] + " \t", "01-" + VALID[3:] + "x"]


@pytest.mark.parametrize("as_bytes", [True, False], ids=["asgi-bytes", "grpc-str"])
def test_traceparent_and_tracestate_are_read_as_w3c_says(as_bytes):
    recorder = new_recorder(max_size=0, batch_size=1)
    encode = (lambda s: s.encode("latin-1")) if as_bytes else (lambda s: s)
    states = [None, "a=1, b ,c=2 ", " x=y", ",,"]
    for i, traceparent in enumerate([*CASES, *mutations(random.Random(5))]):
        state = states[i % len(states)]
        headers = [(encode("content-type"), encode("application/json")), (encode("traceparent"), encode(traceparent))]
        if state is not None:
            headers.append((encode("tracestate"), encode(state)))
        span = recorder.server_span("POST /x", {}, headers)
        expected = expected_parent(traceparent, state)
        if expected is None:
            assert span.parent_id == 0 and span.trace_id != 0 and span.trace_state == "", traceparent
        else:
            assert (span.trace_id, span.parent_id, span.trace_state) == expected, traceparent
        assert span.span_id != 0


def test_spans_without_trace_context_start_distinct_traces():
    recorder = new_recorder(max_size=0, batch_size=1)
    spans = [recorder.server_span("POST /x", {}, [(b"tracestate", b"a=1")]) for _ in range(1000)]
    assert len({s.trace_id for s in spans}) == 1000 and len({s.span_id for s in spans}) == 1000
    assert all(s.trace_id >> 64 and s.parent_id == 0 and s.trace_state == "" for s in spans)


def test_records_decode_to_what_was_recorded():
    """Shared and unshared names and attributes, events, children, the inline model span and a second
    one, a failed span, in batches taken in pieces: each decodes to its own fields."""
    recorder, decoder = new_recorder(max_size=64, batch_size=64), SpanDecoder()
    route, ok = share({"url.path": "/v2/models/m/infer"}), share({"status": 200})
    model_name, model_attributes = share("infer m"), share({"model": "m"})
    expected = []
    for i in range(10):
        own = {"i": i}
        headers = [(b"traceparent", VALID.encode())] if i % 3 == 0 else []
        span = recorder.server_span(f"POST {i}" if i % 2 else share("POST /v2/models/m/infer"), route, headers)
        span.__enter__()
        assert current_span.get() is span
        t = time.perf_counter_ns()
        if i % 4 != 3:
            span.model_span(model_name, model_attributes if i % 5 else own, t, t + 10, t + 30, i + 1, None)
        if i % 4 == 1:
            span.model_span(model_name, model_attributes, t, t + 5, t + 6, 1, None)
            span.add_event("response", {"index": 0})
        child = span.child("step", own)
        child.end()
        span.close(ok if i % 2 else own, STATUS_ERROR if i == 7 else STATUS_UNSET)
        assert current_span.get() is None
        expected.append((span, child, i))
    spans = []
    for limit in (3, 1, 7, 64):  # takes cut between records with and without extras
        batch = recorder.take(limit)
        spans += decoder.decode(batch)
    assert recorder.take(64) is None and recorder.pending == 0
    for (span, child, i), step, server in zip(expected, spans[0::2], spans[1::2], strict=True):
        assert server[:9] == (span.trace_id, span.span_id, span.parent_id, i % 3 == 0, "", f"POST {i}" if i % 2
                              else "POST /v2/models/m/infer", SPAN_KIND_SERVER, span.start_time, server[8])
        assert server[9] == ({"status": 200} if i % 2 else {"i": i}) and server[11:13] == (
            (STATUS_ERROR if i == 7 else STATUS_UNSET), "")
        assert (server[10] is not None) == (i % 4 == 1)
        models = server[13] or []
        assert len(models) == (0 if i % 4 == 3 else 2 if i % 4 == 1 else 1)
        if models:
            name, start, end, attributes, status, message, phases = models[0]
            assert (name, status, message) == ("infer m", STATUS_UNSET, "")
            assert attributes == ({"model": "m"} if i % 5 else {"i": i})
            assert end - start == 30 and phases == [(None, start, start + 10, end, i + 1)]
            assert server[7] - 10**6 <= start <= end <= server[8] + 10**6  # its clock offset is ms-exact
        assert step[:3] == (span.trace_id, child.span_id, span.span_id) and step[5:7] == ("step", SPAN_KIND_INTERNAL)
        assert step[9] == {"i": i} and server[7] <= step[7] <= step[8] <= server[8]


def test_a_full_buffer_drops_and_counts_spans_with_their_children():
    notified = []
    recorder = new_recorder(max_size=4, batch_size=3)
    recorder.notify = notified.append
    for i in range(6):
        span = recorder.server_span("POST /x", {}, ())
        if i == 5:
            t = time.perf_counter_ns()
            span.model_span("infer m", {}, t, t, t, 1, None)
            span.model_span("infer m", {}, t, t, t, 1, [("prefill", time.monotonic_ns(), time.monotonic_ns(), {})])
        span.end()
    assert notified == [1, 3] and recorder.pending == 4
    assert recorder.num_dropped == 1 + 3  # the fifth span, the sixth with its two model spans
    assert len(SpanDecoder().decode(recorder.take(10))) == 4
    nothing_kept = new_recorder(max_size=0, batch_size=1)
    nothing_kept.server_span("POST /x", {}, ()).end()
    assert nothing_kept.pending == 0 and nothing_kept.num_dropped == 1


def test_a_restarted_exporter_process_gets_the_shared_objects_again(monkeypatch):
    """The first process learns the shared names with its batch, then dies; the next batch names only
    what is new, so the restarted process must be sent the rest again to decode it."""
    monkeypatch.setattr(trace_export, "RESTART_DELAY_S", 0.0)
    httpd, posts = receiver()
    recorder = new_recorder(max_size=16, batch_size=16)
    first, second = share(f"first {time.time_ns()}"), share(f"second {time.time_ns()}")
    sink = ExporterProcess(f"http://127.0.0.1:{httpd.server_port}/v1/traces", {}, 16)
    try:
        recorder.server_span(first, {}, ()).end()
        sink.send(recorder.take(16))
        deadline = time.monotonic() + 30
        while not posts and time.monotonic() < deadline:
            time.sleep(0.05)
        sink._proc.kill()
        sink._proc.wait()
        for name in (first, second):
            recorder.server_span(name, {}, ()).end()
        sink.send(recorder.take(16))
        sink.close(10)
    finally:
        httpd.shutdown()
    assert posts == [[first], [first, second]]
