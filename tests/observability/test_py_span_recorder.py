"""The pure-Python span recorder (`py_span_recorder`), the fallback where the C extension was not built:
it records what the C one records for the same calls, the recorder in use is the one asked for, and the
tracing tests pass with it (they run again in a subprocess with `MODELPLEX_SPAN_RECORDER=python`)."""
from __future__ import annotations

import contextvars
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from modelplex.observability import py_span_recorder, trace_spans
from modelplex.observability.trace_spans import FLAG_MODEL, RECORD, STATUS_ERROR, STATUS_UNSET, Span

HERE = Path(__file__).resolve().parent
C_MODULE = "modelplex.observability._span_recorder"
C_BUILT = importlib.util.find_spec(C_MODULE) is not None
# Every test module that records spans (test_llm_tracing.py too, but it loads an LLM: its spans are the
# stream, prefill and event kinds that test_stream_tracing and test_trace_spans already cover).
TRACING_TESTS = ["test_span_recorder.py", "test_trace_spans.py", "test_otlp_exporter.py", "test_tracing.py",
                 "test_stream_tracing.py", "test_trace_export.py"]
VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_recorder_in_use_is_the_one_asked_for():
    asked = os.environ.get("MODELPLEX_SPAN_RECORDER", "")
    expected = "python" if asked == "python" or not C_BUILT else "c"
    module = C_MODULE if expected == "c" else py_span_recorder.__name__
    assert (trace_spans.SPAN_RECORDER, trace_spans.Recorder.__module__) == (expected, module)


def test_the_c_recorder_is_built_where_a_compiler_is():
    """The extension is optional at install; where a compiler is, it must still build, or a broken C file
    would go unnoticed (the tests of it skip)."""
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) here")
    assert C_BUILT, "the span recorder's C extension did not build: see `pip install -v -e .` for why"


@pytest.mark.parametrize("asked, expected", [("python", "python"), ("c", "c"), ("", "c"), ("C", None)])
def test_the_environment_variable_picks_the_recorder(asked, expected):
    if expected == "c" and not C_BUILT:
        pytest.skip("the C span recorder is not built here")
    probe = "from modelplex.observability import trace_spans as t; print(t.SPAN_RECORDER, t.Recorder.__module__)"
    run = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "MODELPLEX_SPAN_RECORDER": asked},
                         capture_output=True, text=True)
    if expected is None:
        assert run.returncode != 0 and "MODELPLEX_SPAN_RECORDER must be c, python or unset" in run.stderr
    else:
        module = C_MODULE if expected == "c" else py_span_recorder.__name__
        assert run.stdout.split() == [expected, module], run.stderr


ROUTE, ROUTE_NAME = {"url.path": "/v2/models/m/infer"}, "POST /v2/models/m/infer"
MODEL_NAME, MODEL_ATTRIBUTES = "infer m", {"model": "m"}


def record_scenario(impl) -> tuple:
    """The same calls on a recorder of `impl` (either module): the records with ids as ordinals, shared
    references as what they refer to and wall-clock times left out; the extras (times left out too), the
    notifications and the drop count."""
    methods = {k: v for k, v in vars(Span).items() if callable(v)}  # trace_spans.Span's, on this impl's core
    recorder = impl.Recorder(40, 4, type("Span", (impl.SpanCore,), {"__slots__": (), **methods}),
                             contextvars.ContextVar("current", default=None))
    notified = []
    recorder.notify = notified.append
    route, model_name, model_attributes = impl.share(ROUTE), impl.share(MODEL_NAME), impl.share(MODEL_ATTRIBUTES)
    step = impl.share("step")
    t = time.perf_counter_ns()
    for i in range(24):  # the buffer fills at the 20th request: the rest are dropped with their children
        own = {"i": i}
        headers = [(b"content-type", b"x"), (b"traceparent", VALID.encode()), (b"tracestate", b" a=1 ,b")]
        if i % 3 == 1:  # a list pair, an invalid traceparent first: the valid one under a bytearray name is no header
            headers = [["traceparent", VALID[:-1]], ("tracestate", "c=2"), (bytearray(b"traceparent"), VALID)]
        elif i % 3 == 2:  # not a pair; a traceparent that is None comes first
            headers = [(b"traceparent", None, b"x"), (b"traceparent", None), (b"traceparent", VALID.encode())]
        span = recorder.server_span(f"POST {i}" if i % 2 else impl.share(ROUTE_NAME), route if i % 4 else own,
                                    headers)
        span.__enter__()
        if i % 4 != 3:
            span.model_span(model_name, model_attributes if i % 5 else own, t, t + 10, t + 30, i + 1, None)
        if i % 4 == 1:
            span.model_span(model_name, own, t, t + 5, t + 6, 1, [("prefill", t, t + 1, {})])
            span.add_event("response", {"index": 0})
        if i == 14:
            span.events = []  # set, though empty (i == 2 is recorded without)
        child = span.child(step if i % 2 else f"step {i}", route if i % 2 else own)
        child.set_status(STATUS_ERROR, "" if i % 2 else "bad")
        child.end()
        if i == 7:
            with pytest.raises(ValueError), span.child("failing", route):
                raise ValueError("no")
        span.close(None if i % 4 == 2 else own, STATUS_ERROR if i == 9 else STATUS_UNSET)
    batches = [recorder.take(n) for n in (5, 1, 50, 1)]
    assert batches[-1] is None and recorder.pending == 0
    ids: dict[int, int] = {}
    records, extras = [], []
    for _, _, data, _, batch_extras in batches[:-1]:
        extras += timeless(batch_extras)
        for (trace_hi, trace_lo, span_id, parent_id, _start, _end, m_enqueue, m_start, m_end, m_batch, extra, *refs,
             status, kind, flags) in RECORD.iter_unpack(data):
            ordinals = [ids.setdefault(x, len(ids)) if x else 0
                        for x in (trace_hi << 64 | trace_lo, span_id, parent_id)]
            refs = refs if flags & FLAG_MODEL else refs[:2]  # without a model span its references are 0: unused
            objects = [impl.shared[r] if r >= 0 else r for r in refs]
            records.append((*ordinals, m_start - m_enqueue, m_end - m_enqueue, m_batch, extra, *objects, status, kind,
                            flags))
    return records, extras, notified, recorder.num_dropped


def timeless(value):
    """`value` with nanosecond timestamps (ints past 2001 as wall time) as "t": each recorder's clock offset differs."""
    if isinstance(value, (tuple, list)):
        return type(value)(timeless(v) for v in value)
    return "t" if isinstance(value, int) and value > 10**18 else value


@pytest.mark.skipif(not C_BUILT, reason="the C span recorder is not built here")
def test_both_recorders_record_the_same_for_the_same_calls():
    c = importlib.import_module(C_MODULE)
    from_c, from_python = record_scenario(c), record_scenario(py_span_recorder)
    assert from_python == from_c
    records, extras, notified, num_dropped = from_c  # and the scenario reached what it meant to
    assert len(records) == 40 and notified == [1, 4] and num_dropped > 4
    assert 0 < sum(r[6] >= 0 for r in records) == len(extras) < len(records)
    assert {r[-1] for r in records} == {0, 1, 2, 3}  # remote parents or not, model spans inline or not


@pytest.mark.slow
def test_the_tracing_tests_pass_with_the_python_recorder():
    """The whole tracing suite again in a child pytest, forced onto the fallback (servers it starts inherit the
    variable); the child checks it really is the fallback (`test_the_recorder_in_use_is_the_one_asked_for`)."""
    env = {**os.environ, "MODELPLEX_SPAN_RECORDER": "python"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *TRACING_TESTS, f"{Path(__file__).name}::test_the_recorder_in_use_is_the_one_asked_for"],
                         cwd=HERE, env=env, capture_output=True, text=True, timeout=600)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert not re.search(r"\d+ (skipped|deselected)", summary), summary
