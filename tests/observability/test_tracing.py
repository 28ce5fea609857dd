"""Tracing end to end: a client's `traceparent` through a real server (HTTP and gRPC) gives one trace
with the front door's span, the ensemble, each step, each step model, and their queue/compute spans."""
from __future__ import annotations

import asyncio

import grpc
import httpx
import numpy as np
from helpers.inprocess import traced_server
from helpers.tracing import ON, TRACE_ID, TRACEPARENT, A, B, check_ensemble_trace, infer_body
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from modelplex.observability.tracing import TraceConfig


def test_http_traceparent_gives_one_trace_through_the_ensemble(ensemble_repo):
    async def main():
        async with traced_server(ensemble_repo, ON) as (server, exporter):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.ports['http']}") as client:
                r = await client.post("/v2/models/ensemble_add_sub/infer", json=infer_body(),
                                      headers={"traceparent": TRACEPARENT})
                assert r.status_code == 200, r.text
            server.dataplane.tracing.flush()
            return exporter.get_finished_spans()

    spans = asyncio.run(main())
    check_ensemble_trace(spans, "POST /v2/models/ensemble_add_sub/infer")
    root = [s for s in spans if s.name.startswith("POST")][0]
    assert root.attributes["http.response.status_code"] == 200


def test_grpc_traceparent_metadata_gives_one_trace_through_the_ensemble(ensemble_repo):
    request = pb.ModelInferRequest(model_name="ensemble_add_sub")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
    request.raw_input_contents.extend([A.tobytes(), B.tobytes()])

    async def main():
        async with traced_server(ensemble_repo, ON) as (server, exporter):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                response = await stub.ModelInfer(request, metadata=(("traceparent", TRACEPARENT),), timeout=10)
            server.dataplane.tracing.flush()
            return response, exporter.get_finished_spans()

    response, spans = asyncio.run(main())
    assert np.frombuffer(response.raw_output_contents[0], np.int32).tolist() == (A + B).tolist()
    check_ensemble_trace(spans, "ModelInfer")


def test_rate_count_and_runtime_settings_decide_what_is_traced(ensemble_repo):
    """rate=2 traces every second request, count=2 stops after two traces; a model's override
    applies to that model only; `null` clears it; unknown or malformed settings are 400."""
    simple = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": A.tolist()}
                         for n in ("INPUT0", "INPUT1")]}

    async def main():
        async with traced_server(ensemble_repo, TraceConfig()) as (server, exporter):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.ports['http']}") as client:
                async def roots(n):
                    exporter.clear()
                    for _ in range(n):
                        assert (await client.post("/v2/models/simple/infer", json=simple)).status_code == 200
                    server.dataplane.tracing.flush()
                    return sum(s.name.startswith("POST") for s in exporter.get_finished_spans())

                assert (await client.get("/v2/trace/setting")).json()["trace_level"] == ["OFF"]
                assert await roots(3) == 0
                r = await client.post("/v2/trace/setting",
                                      json={"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "2"})
                assert r.json() | {} == {"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "2",
                                         "log_frequency": "0", "trace_file": "", "trace_mode": "opentelemetry"}
                assert await roots(7) == 2
                assert (await client.get("/v2/trace/setting")).json()["trace_count"] == "0"
                r = await client.post("/v2/models/simple/trace/setting", json={"trace_count": "-1", "trace_rate": 1})
                assert r.json()["trace_rate"] == "1" and r.json()["trace_count"] == "-1"
                assert await roots(3) == 3
                r = await client.post("/v2/models/simple/trace/setting", json={"trace_count": None, "trace_rate": None})
                assert r.json()["trace_count"] == "0"  # the global setting again
                assert await roots(2) == 0
                bad = [("/v2/trace/setting", {"trace_colour": "red"}, "unknown trace setting 'trace_colour'"),
                       ("/v2/trace/setting", {"trace_rate": "0"}, "trace_rate must be an integer >= 1"),
                       ("/v2/trace/setting", {"trace_level": ["LOUD"]}, "trace_level must be a list of"),
                       ("/v2/trace/setting", {"trace_file": "/tmp/x"}, "'trace_file' cannot be changed"),
                       ("/v2/models/nope/trace/setting", {"trace_rate": "1"}, "model 'nope' is not in")]
                for path, body, message in bad:
                    r = await client.post(path, json=body)
                    assert r.status_code == (404 if "nope" in path else 400) and message in r.json()["error"], r.text

    asyncio.run(main())


def test_python_bls_calls_join_the_callers_trace(tmp_path):
    """A Python model's BLS call runs as a child of that model's span (the host hands the executing
    request's context to the BLS call it serves)."""
    import shutil
    from pathlib import Path

    from build_repository import build

    build(tmp_path, ["add_sub"])
    shutil.copytree(Path(__file__).resolve().parents[1] / "python_backend" / "models" / "bls_sync", tmp_path / "bls_sync")
    body = {"inputs": [{"name": "MODEL_NAME", "datatype": "BYTES", "shape": [1], "data": ["add_sub"]},
                       {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
                       {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]}]}

    async def main():
        async with traced_server(tmp_path, ON, allow_grpc=False) as (server, exporter):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.ports['http']}") as client:
                r = await client.post("/v2/models/bls_sync/infer", json=body, headers={"traceparent": TRACEPARENT})
                assert r.status_code == 200, r.text
            server.dataplane.tracing.flush()
            return exporter.get_finished_spans()

    spans = {s.name: s for s in asyncio.run(main())}
    assert {format(s.context.trace_id, "032x") for s in spans.values()} == {TRACE_ID}
    assert spans["infer add_sub"].parent.span_id == spans["infer bls_sync"].context.span_id
    assert spans["infer bls_sync"].parent.span_id == spans["POST /v2/models/bls_sync/infer"].context.span_id


def test_http_server_spans_carry_each_answers_status(ensemble_repo):
    """Server spans share their attribute dicts per path: a 400 or 404 answer gets its own status and
    leaves the 200 answers' untouched; neither is an error span (only a 5xx is)."""
    good = infer_body()
    bad = {"inputs": [{**good["inputs"][0], "shape": [1, 15], "data": A[:15].tolist()}, good["inputs"][1]]}

    async def main():
        async with traced_server(ensemble_repo, ON) as (server, exporter):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.ports['http']}") as client:
                for path, body, status in [("simple", good, 200), ("simple", bad, 400), ("simple", good, 200),
                                           ("nope", good, 404)]:
                    r = await client.post(f"/v2/models/{path}/infer", json=body)
                    assert r.status_code == status, r.text
            server.dataplane.tracing.flush()
            return exporter.get_finished_spans()

    spans = asyncio.run(main())
    roots = sorted((s for s in spans if s.name.startswith("POST")), key=lambda s: s.start_time)
    assert [(s.name, s.attributes["http.response.status_code"], s.status.is_ok) for s in roots] == [
        ("POST /v2/models/simple/infer", 200, True), ("POST /v2/models/simple/infer", 400, True),
        ("POST /v2/models/simple/infer", 200, True), ("POST /v2/models/nope/infer", 404, True)]
    assert all(s.attributes["model"] == s.name.split("/")[3] for s in roots)
    # The model refused the 400's input: its span is an error span, with no queue or compute under it.
    children = {}
    for s in spans:
        children.setdefault(s.parent and s.parent.span_id, []).append(s)
    models = [children[root.context.span_id] for root in roots[:3]]
    assert [[s.name for s in m] for m in models] == [["infer simple"]] * 3
    assert [m[0].status.is_ok for m in models] == [True, False, True]
    assert "shape" in models[1][0].status.description, models[1][0].status.description
    assert [sorted(s.name for s in children.get(m[0].context.span_id, ())) for m in models] == [
        ["compute", "queue"], [], ["compute", "queue"]]
