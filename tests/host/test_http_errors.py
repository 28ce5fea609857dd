"""Bad requests against a real server: each gets the right status and a message naming the problem,
and the next good request still succeeds. The server runs with a 64 KiB body limit."""
from __future__ import annotations

import gzip
import socket

import httpx
import numpy as np
import orjson
import pytest
from helpers.serverproc import ServerProcess

from modelplex.core.errors import NotFound, Unavailable
from modelplex.http.errors import modelplex_error

LIMIT = 65536
A = list(range(16))
GOOD = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": A},
                   {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": A}]}


@pytest.fixture(scope="module")
def server(example_repo):
    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "*",
                       "--http-max-body-bytes", str(LIMIT)) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as c:
        yield c


def with_input(**changes) -> bytes:
    body = orjson.loads(orjson.dumps(GOOD))
    body["inputs"][0].update(changes)
    return orjson.dumps(body)


def binary_body(tail_bytes: int) -> tuple[bytes, dict]:
    """INPUT0 as 64 declared binary bytes, followed by `tail_bytes` actual bytes."""
    head = orjson.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}},
        GOOD["inputs"][1]]})
    return head + bytes(tail_bytes), {"Inference-Header-Content-Length": str(len(head))}


BAD = [
    ("malformed JSON", "/v2/models/simple/infer", b'{"inputs": [', {}, 400,
     "malformed JSON in the request body"),
    ("wrong datatype", "/v2/models/simple/infer", with_input(datatype="FP32"), {}, 400,
     "input 'INPUT0' has datatype FP32, model 'simple' expects INT32"),
    ("strings for INT32", "/v2/models/simple/infer", with_input(data=[str(x) for x in A]), {}, 400,
     "input 'INPUT0' has datatype INT32 but 'data' holds strings"),
    ("short data", "/v2/models/simple/infer", with_input(data=A[:15]), {}, 400,
     "input 'INPUT0': shape needs 16 elements but 'data' has 15"),
    ("shape not in the config", "/v2/models/simple/infer", with_input(shape=[1, 8, 2]), {}, 400,
     "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1, 16], got [1, 8, 2]"),
    ("FP16 as JSON", "/v2/models/simple/infer", with_input(datatype="FP16"), {}, 400,
     "receiving FP16 data via JSON is not supported. Please use the binary data format for input 'INPUT0'"),
    ("binary tail too short", "/v2/models/simple/infer", *binary_body(60), 400,
     "input 'INPUT0' declares 64 bytes of binary data but only 60 bytes are left in the body"),
    ("binary tail too long", "/v2/models/simple/infer", *binary_body(68), 400,
     "the body carries 68 bytes of binary tensor data but the inputs' binary_data_size add up to 64"),
    ("bad header length", "/v2/models/simple/infer", orjson.dumps(GOOD), {"Inference-Header-Content-Length": "x"},
     400, "invalid Inference-Header-Content-Length 'x'"),
    ("non-ASCII digit in the header length", "/v2/models/simple/infer", orjson.dumps(GOOD),
     {"Inference-Header-Content-Length": "\u00b2".encode("latin-1")}, 400, "invalid Inference-Header-Content-Length"),
    ("unknown input", "/v2/models/simple/infer", with_input(name="INPUT9"), {}, 400,
     "unexpected inference input 'INPUT9' for model 'simple'"),
    ("unknown output", "/v2/models/simple/infer", orjson.dumps(GOOD | {"outputs": [{"name": "OUT"}]}), {}, 400,
     "unexpected inference output 'OUT' for model 'simple'"),
    ("unknown model", "/v2/models/nope/infer", orjson.dumps(GOOD), {}, 404, "Request for unknown model: 'nope' is not found"),
    ("unknown version", "/v2/models/simple/versions/3/infer", orjson.dumps(GOOD), {}, 404,
     "Request for unknown model: 'simple' version 3 is not found"),
    ("non-ASCII digit as the version", "/v2/models/simple/versions/\u00b2/infer", orjson.dumps(GOOD), {}, 400,
     "invalid model version '\u00b2'"),
    ("unknown encoding", "/v2/models/simple/infer", orjson.dumps(GOOD), {"Content-Encoding": "br"}, 400,
     "unsupported Content-Encoding 'br': use gzip, deflate or identity"),
    ("broken gzip", "/v2/models/simple/infer", orjson.dumps(GOOD), {"Content-Encoding": "gzip"}, 400,
     "request body is not valid gzip data"),
    ("gzip bomb", "/v2/models/simple/infer", gzip.compress(b" " * (LIMIT + 1)), {"Content-Encoding": "gzip"}, 400,
     f"decompressed request body exceeds the server's limit of {LIMIT} bytes"),
    ("body over the limit", "/v2/models/simple/infer", b" " * (LIMIT + 1), {}, 400,
     f"request body of {LIMIT + 1} bytes exceeds the server's limit of {LIMIT} bytes"),
    ("load with bad base64", "/v2/repository/models/simple/load",
     orjson.dumps({"parameters": {"config": "{}", "file:1/model.onnx": "!!"}}), {}, 400,
     "load parameter 'file:1/model.onnx' is not valid base64"),
    ("unload with a bad flag", "/v2/repository/models/simple/unload",
     orjson.dumps({"parameters": {"unload_dependents": "yes"}}), {}, 400, "'unload_dependents' must be true or false"),
]


def assert_good_request_works(http):
    response = http.post("/v2/models/simple/infer", content=orjson.dumps(GOOD))
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [2 * x for x in A]


@pytest.mark.parametrize("path, body, headers, status, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_request_is_refused_and_the_server_keeps_serving(http, path, body, headers, status, message):
    response = http.post(path, content=body, headers=headers)
    assert response.status_code == status and response.json()["error"].startswith(message), response.text
    assert response.headers["content-type"] == "application/json"
    assert_good_request_works(http)


@pytest.mark.parametrize("path", ["/v2/models/simple/versions/\u00b2", "/v2/models/simple/versions/\u00b2/ready",
                                  "/v2/models/simple/versions/\u00b2/config"])
def test_non_ascii_digit_version_in_a_get_is_refused(http, path):
    # str.isdigit() passes '\u00b2' (superscript two), which int() refuses: was a 500 (found by schemathesis)
    response = http.get(path)
    assert (response.status_code, response.json()) == (400, {"error": "invalid model version '\u00b2'"})


def test_streamed_body_over_the_limit_is_cut_off(http):
    def chunks():
        for _ in range(LIMIT // 4096 + 2):
            yield b" " * 4096

    response = http.post("/v2/models/simple/infer", content=chunks())  # chunked: no Content-Length
    assert (response.status_code, response.json()) == (
        400, {"error": f"request body exceeds the server's limit of {LIMIT} bytes"})
    assert_good_request_works(http)


def test_oversized_content_length_is_refused_before_the_body_is_sent(server, http):
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
        reply = b""
        while b"}" not in reply:  # headers and the JSON error may come in separate segments
            chunk = sock.recv(4096)
            assert chunk, f"connection closed after {reply!r}"
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400 ") and b"exceeds the server's limit" in reply
    assert_good_request_works(http)


def test_wrong_method_and_unknown_path_answer_in_the_error_shape(http):
    response = http.get("/v2/models/simple/infer")
    assert (response.status_code, response.json()) == (405, {"error": "Method Not Allowed: GET /v2/models/simple/infer"})
    response = http.get("/v2/nothing")
    assert (response.status_code, response.json()) == (404, {"error": "Not Found: GET /v2/nothing"})


def test_unavailable_carries_retry_after_and_other_errors_do_not():
    response = modelplex_error(None, Unavailable("queue is full", retry_after=1.2))
    assert (response.status_code, response.headers["retry-after"]) == (503, "2")
    assert orjson.loads(response.body) == {"error": "queue is full"}
    response = modelplex_error(None, NotFound("gone"))
    assert response.status_code == 404 and "retry-after" not in response.headers


def test_binary_input_that_is_not_a_multiple_of_the_datatype(http):
    body, headers = binary_body(64)
    head_length = int(headers["Inference-Header-Content-Length"])
    header = orjson.loads(body[:head_length])
    header["inputs"][0]["parameters"]["binary_data_size"] = 63
    head = orjson.dumps(header)
    response = http.post("/v2/models/simple/infer", content=head + np.zeros(63, np.uint8).tobytes(),
                         headers={"Inference-Header-Content-Length": str(len(head))})
    assert (response.status_code, response.json()) == (400, {
        "error": "input 'INPUT0': binary_data_size is 63 bytes but shape and datatype INT32 need 64"})
    assert_good_request_works(http)
