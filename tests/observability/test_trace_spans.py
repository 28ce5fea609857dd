"""Spans as the request path records them: a model that calls no other model gets a `SpanRecord`,
which must come out of the export with the same parent links and status as a live span."""
from __future__ import annotations

import time
from contextlib import nullcontext

import pytest

from modelplex.trace_spans import (SPAN_KIND_INTERNAL, SPAN_KIND_SERVER, STATUS_ERROR, STATUS_UNSET, Span, SpanBuffer,
                                   SpanRecord, current_span, expand_children)


def test_a_recorded_model_span_nests_its_phases_and_keeps_its_error():
    buffer = SpanBuffer(max_size=16, batch_size=16)
    with Span(buffer, "POST /v2/models/m/infer", 7, 0, False, "", SPAN_KIND_SERVER, {}) as server:
        for failing in (False, True):
            with pytest.raises(ValueError) if failing else nullcontext():
                with SpanRecord(server, "infer m", {"model": "m"}) as record:
                    t = time.perf_counter_ns()
                    record.phases(t, t + 1_000, t + 2_000, 3)
                    assert current_span.get() is server  # never made current
                    if failing:
                        raise ValueError("bad input")
    assert current_span.get() is None
    spans = expand_children(buffer.take(16))
    assert len(spans) == 7 and len({s[1] for s in spans}) == 7 and {s[0] for s in spans} == {7}
    root, ok, *ok_phases = spans[:4]
    failed, *failed_phases = spans[4:]
    assert root[5] == "POST /v2/models/m/infer" and root[2] == 0
    expected = ((ok, ok_phases, (STATUS_UNSET, "")), (failed, failed_phases, (STATUS_ERROR, "ValueError: bad input")))
    for model, phases, status in expected:
        assert model[5] == "infer m" and model[2] == root[1] and model[6] == SPAN_KIND_INTERNAL
        assert (model[11], model[12]) == status
        assert [p[5] for p in phases] == ["queue", "compute"]
        for phase in phases:
            assert phase[2] == model[1]
            assert model[7] <= phase[7] <= phase[8] <= model[8]
        assert phases[1][9] == {"modelplex.batch_size": 3}
        assert root[7] <= model[7] <= model[8] <= root[8]

