"""Spans as the request path records them: a model that calls no other model is added to its
caller's span once done (`Span.model_span`), and must come out of the export with the same parent
links, phases and status as a live span."""
from __future__ import annotations

import asyncio
import time

from modelplex.observability.trace_spans import (
    SPAN_KIND_INTERNAL,
    SPAN_KIND_SERVER,
    STATUS_ERROR,
    STATUS_UNSET,
    Span,
    SpanDecoder,
    current_span,
    expand_children,
    new_recorder,
)


def test_a_model_span_added_once_done_nests_its_phases_and_keeps_its_error():
    recorder = new_recorder(max_size=16, batch_size=16)
    with Span(recorder, "POST /v2/models/m/infer", 7, 0, False, "", SPAN_KIND_SERVER, {}) as server:
        t = time.perf_counter_ns()
        server.model_span("infer m", {"model": "m"}, t, t + 1_000, t + 2_000, 3,
                          [("prefill", time.monotonic_ns(), time.monotonic_ns() + 500, {"tokens": 4})])
        server.model_span_failed("infer m", {"model": "m"}, time.perf_counter_ns(), ValueError("bad input"))
        server.model_span_failed("infer m", {"model": "m"}, time.perf_counter_ns(), asyncio.CancelledError())
        assert current_span.get() is server
    assert current_span.get() is None
    spans = expand_children(SpanDecoder().decode(recorder.take(16)))
    assert len(spans) == 7 and len({s[1] for s in spans}) == 7 and {s[0] for s in spans} == {7}
    root, ok, queue, compute, prefill, failed, cancelled = spans
    assert root[5] == "POST /v2/models/m/infer" and root[2] == 0
    for model, status in ((ok, (STATUS_UNSET, "")), (failed, (STATUS_ERROR, "ValueError: bad input")),
                          (cancelled, (STATUS_UNSET, ""))):
        assert model[5] == "infer m" and model[2] == root[1] and model[6] == SPAN_KIND_INTERNAL
        assert (model[11], model[12]) == status
        assert root[7] <= model[7] <= model[8] <= root[8]
    assert [p[5] for p in (queue, compute, prefill)] == ["queue", "compute", "prefill"]
    for phase in (queue, compute, prefill):
        assert phase[2] == ok[1]
        assert ok[7] <= phase[7] <= phase[8] <= ok[8]
    assert compute[9] == {"modelplex.batch_size": 3} and prefill[9] == {"tokens": 4}
    assert ok[8] - ok[7] == 2_000  # from the first request's enqueue to its compute's end
