"""Settings bound what one request may hold or take: tensor element counts, BYTES element counts and
sizes (over HTTP binary, HTTP JSON and gRPC), and stream durations. Refusals are 400 before the
memory is taken; a stream past its limit ends with an error and the server keeps serving."""
from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path

import grpc
import httpx
import pytest
import tritonclient.grpc as grpcclient
from helpers.serverproc import ServerProcess
from helpers.stream_clients import repeat_stream
from tritonclient.grpc import service_pb2, service_pb2_grpc

REPEAT = Path(__file__).resolve().parent.parent / "python_backend" / "models" / "repeat_int32"


@pytest.fixture(scope="module")
def bounded(example_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("bounds_repo")
    for name in ("simple", "simple_string"):
        shutil.copytree(example_repo / name, repo / name)
    shutil.copytree(REPEAT, repo / "repeat_int32")
    with ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", "*",
                       "--max-tensor-elements", "64", "--max-bytes-elements", "16", "--max-bytes-element-size", "8",
                       "--max-stream-secs", "1.5", env={"MODELPLEX_PLUGINS": "onnx,python"}) as s:
        yield s


def binary_bytes(url: str, elements: list[bytes], shape: list[int]) -> httpx.Response:
    payload = b"".join(struct.pack("<I", len(e)) + e for e in elements)
    header = json.dumps({"inputs": [{"name": name, "datatype": "BYTES", "shape": shape,
                                     "parameters": {"binary_data_size": len(payload)}}
                                    for name in ("INPUT0", "INPUT1")]}).encode()
    return httpx.post(f"http://{url}/v2/models/simple_string/infer", content=header + payload + payload,
                      headers={"Inference-Header-Content-Length": str(len(header))}, timeout=10)


def test_bytes_elements_within_the_limits_are_served(bounded):
    r = binary_bytes(bounded.http_url, [b"1"] * 16, [1, 16])
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("elements, shape, words", [
    ([b""] * 64, [4, 16], "64 BYTES elements; the server's limit is 16 (--max-bytes-elements)"),
    ([b"123456789"] + [b"1"] * 15, [1, 16], "is 9 bytes; the server's limit is 8 (--max-bytes-element-size)"),
])
def test_http_binary_bytes_past_the_limits_are_400(bounded, elements, shape, words):
    r = binary_bytes(bounded.http_url, elements, shape)
    assert r.status_code == 400 and words in r.json()["error"], r.text


def test_http_json_past_the_limits_is_400(bounded):
    url = f"http://{bounded.http_url}/v2/models"
    too_long = {"inputs": [{"name": n, "datatype": "BYTES", "shape": [1, 16], "data": ["123456789"] * 16}
                           for n in ("INPUT0", "INPUT1")]}
    r = httpx.post(f"{url}/simple_string/infer", json=too_long, timeout=10)
    assert r.status_code == 400 and "--max-bytes-element-size" in r.json()["error"]
    too_many = {"inputs": [{"name": n, "datatype": "INT32", "shape": [5, 16], "data": [0] * 80}
                           for n in ("INPUT0", "INPUT1")]}
    r = httpx.post(f"{url}/simple/infer", json=too_many, timeout=10)
    assert r.status_code == 400 and "80 elements; the server's limit is 64" in r.json()["error"]


def test_grpc_past_the_limits_is_invalid_argument(bounded):
    def refused(request):
        with grpc.insecure_channel(bounded.grpc_url) as channel:
            with pytest.raises(grpc.RpcError) as e:
                service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        return e.value.details()

    raw = service_pb2.ModelInferRequest(model_name="simple_string")
    for name in ("INPUT0", "INPUT1"):
        raw.inputs.add(name=name, datatype="BYTES", shape=[2, 16])
        raw.raw_input_contents.append(struct.pack("<I", 0) * 32)
    assert "--max-bytes-elements" in refused(raw)
    contents = service_pb2.ModelInferRequest(model_name="simple_string")
    for name in ("INPUT0", "INPUT1"):
        contents.inputs.add(name=name, datatype="BYTES", shape=[1, 16]).contents.bytes_contents.extend(
            [b"123456789"] * 16)
    assert "--max-bytes-element-size" in refused(contents)
    assert grpcclient.InferenceServerClient(bounded.grpc_url).is_server_ready()


def test_a_stream_past_its_time_limit_ends_with_an_error_and_the_next_one_runs(bounded):
    t0 = time.monotonic()
    cut = repeat_stream(bounded.grpc_url, list(range(40)), 100)  # 4 s of responses; the limit is 1.5 s
    assert 1.2 < time.monotonic() - t0 < 5
    assert 5 <= len(cut) - 1 < 40 and "--max-stream-secs" in cut[-1], cut
    assert repeat_stream(bounded.grpc_url, [0, 1, 2], 10) == [0, 1, 2, "FINAL"]


def test_generate_text_past_the_element_size_is_400(bounded):
    """The generate route (and the OpenAI routes, through the same check) bound prompt text too."""
    r = httpx.post(f"http://{bounded.http_url}/v2/models/simple_string/generate",
                   json={"INPUT0": "123456789", "INPUT1": "1"}, timeout=10)
    assert r.status_code == 400 and "--max-bytes-element-size" in r.json()["error"], r.text
