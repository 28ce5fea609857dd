"""Tensor sizes a request declares but does not carry are refused with 400 before anything is allocated:
huge shapes, BYTES counts and element lengths beyond the body, over HTTP (binary and JSON) and gRPC."""
from __future__ import annotations

import json
import struct

import grpc
import httpx
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc


def binary_request(url: str, datatype: str, shape: list[int], payload: bytes) -> httpx.Response:
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape,
                                     "parameters": {"binary_data_size": len(payload)}}]}).encode()
    return httpx.post(f"http://{url}/v2/models/simple_string/infer", content=header + payload,
                      headers={"Inference-Header-Content-Length": str(len(header)),
                               "Content-Type": "application/octet-stream"}, timeout=10)


@pytest.mark.parametrize("datatype, shape, payload", [
    ("BYTES", [1, 2**40], struct.pack("<I", 1) + b"x"),            # a count the body cannot hold
    ("BYTES", [1, 1], struct.pack("<I", 2**31) + b"x"),            # an element longer than the body
    ("BYTES", [1, 2], struct.pack("<I", 1) + b"x"),                # fewer elements than the shape
    ("BYTES", [1, 1], struct.pack("<I", 1) + b"xy"),               # bytes left over
    ("INT32", [2**31, 2**31], b"\0" * 16),                         # a huge shape, 16 bytes of data
    ("INT32", [-1, 16], b"\0" * 64),                               # a negative dimension
])
def test_http_binary_sizes_must_match_the_body(server, datatype, shape, payload):
    r = binary_request(server.http_url, datatype, shape, payload)
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith("input 'INPUT0'")


def test_http_json_data_must_match_the_shape(server):
    r = httpx.post(f"http://{server.http_url}/v2/models/simple/infer", json={"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [2**31, 2**31], "data": [1, 2]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}]}, timeout=10)
    assert r.status_code == 400, r.text


def test_grpc_raw_sizes_must_match_the_shape(server):
    request = service_pb2.ModelInferRequest(model_name="simple_string")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="BYTES", shape=[1, 2**40])
        request.raw_input_contents.append(struct.pack("<I", 2**31) + b"x")
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert grpcclient.InferenceServerClient(server.grpc_url).is_server_live()
