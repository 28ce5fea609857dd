"""What the tracing tests share: a client's trace context, the `simple` request body, and the check
that an ensemble's trace has every span it should."""
from __future__ import annotations

import numpy as np

from modelplex.observability.tracing import TraceConfig

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01"
A = np.arange(16, dtype=np.int32)
B = np.ones(16, dtype=np.int32)
ON = TraceConfig(level="TIMESTAMPS", rate=1)


def infer_body() -> dict:
    return {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": A.tolist()},
                       {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": B.tolist()}]}


def check_ensemble_trace(spans, server_span_name: str) -> None:
    assert {format(s.context.trace_id, "032x") for s in spans} == {TRACE_ID}
    by_id = {s.context.span_id: s for s in spans}
    children = {}
    for s in spans:
        children.setdefault(s.parent.span_id if s.parent else None, []).append(s)
    (root,) = [s for s in spans if s.parent is None or s.parent.span_id not in by_id]
    assert root.name == server_span_name
    assert format(root.parent.span_id, "016x") == CLIENT_SPAN_ID and root.parent.is_remote
    (ensemble,) = children[root.context.span_id]
    assert ensemble.name == "infer ensemble_add_sub"
    steps = sorted(s.name for s in children[ensemble.context.span_id])
    assert steps == ["compute", "queue", "step 1 simple", "step 2 simple", "step 3 simple", "step 4 simple"]
    for step in children[ensemble.context.span_id]:
        if step.name.startswith("step"):
            (model,) = children[step.context.span_id]
            assert model.name == "infer simple" and model.attributes["model"] == "simple"
            assert sorted(s.name for s in children[model.context.span_id]) == ["compute", "queue"]
            for phase in children[model.context.span_id]:
                assert model.start_time <= phase.start_time <= phase.end_time <= model.end_time, phase.name
    # Steps 3 and 4 both wait for step 2 only: their spans start after step 2's ends.
    step = {s.name: s for s in children[ensemble.context.span_id]}
    assert step["step 2 simple"].end_time <= step["step 3 simple"].start_time
    assert len(spans) == 20
