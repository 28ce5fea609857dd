"""Triton behaviours its clients and tests rely on (issue 26): raw binary requests, generate inputs
shaped to the model's dims, the codes and words of unknown models, load refusals and duplicate
outputs, and HTTP headers forwarded as request parameters."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from helpers.infer_clients import PROTOCOLS, client
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

ECHO = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {batch}
input [ {{ name: "PROMPT" data_type: TYPE_STRING dims: [ {dims} ] }},
        {{ name: "STREAM" data_type: TYPE_BOOL dims: [ {dims} ] }} ]
output [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ {dims} ] }} ]
"""
ONE_INPUT = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {batch}
input [ {{ name: "X" data_type: {dtype} dims: [ {dims} ] }} ]
output [ {{ name: "Y" data_type: {dtype} dims: [ {dims} ] }} ]
"""
PARAMS_MODEL = '''\
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PARAMS", np.array([r.parameters().encode()], np.object_))])
                for r in requests]
'''
PARAMS_CONFIG = """\
name: "params"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def identity(inputs: dict[str, int], outputs: dict[str, str], rank: int):
    """An ONNX model copying input `outputs[name]` to each output `name` (element types by ONNX enum)."""
    import onnx
    from onnx import helper

    dims = [f"d{i}" for i in range(rank)]
    graph = helper.make_graph(
        [helper.make_node("Identity", [source], [name]) for name, source in outputs.items()], "identity",
        [helper.make_tensor_value_info(n, t, dims) for n, t in inputs.items()],
        [helper.make_tensor_value_info(n, inputs[s], dims) for n, s in outputs.items()])
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def repo(tmp_path_factory, example_repo):
    import shutil

    import onnx
    from onnx import TensorProto as T
    out = tmp_path_factory.mktemp("conformance")
    shutil.copytree(example_repo / "simple", out / "simple")
    models = {
        "echo": (ECHO.format(name="echo", batch=0, dims="1, 1"), identity({"PROMPT": T.STRING, "STREAM": T.BOOL},
                                                                           {"TEXT": "PROMPT"}, 2)),
        "echo_batched": (ECHO.format(name="echo_batched", batch=4, dims="1"),
                         identity({"PROMPT": T.STRING, "STREAM": T.BOOL}, {"TEXT": "PROMPT"}, 2)),
        "raw_fp32": (ONE_INPUT.format(name="raw_fp32", batch=8, dtype="TYPE_FP32", dims="-1"),
                     identity({"X": T.FLOAT}, {"Y": "X"}, 2)),
        "raw_bytes": (ONE_INPUT.format(name="raw_bytes", batch=0, dtype="TYPE_STRING", dims="1"),
                      identity({"X": T.STRING}, {"Y": "X"}, 1)),
    }
    for name, (config, model) in models.items():
        (out / name / "1").mkdir(parents=True)
        (out / name / "config.pbtxt").write_text(config)
        onnx.save(model, out / name / "1" / "model.onnx")
    (out / "params" / "1").mkdir(parents=True)
    (out / "params" / "config.pbtxt").write_text(PARAMS_CONFIG)
    (out / "params" / "1" / "model.py").write_text(PARAMS_MODEL)
    (out / "broken" / "1").mkdir(parents=True)
    (out / "broken" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: -3\n')
    return out


@pytest.fixture(scope="module")
def server(repo):
    with ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", "*", "--exit-on-error=false",
                       "--http-header-forward-pattern", "^x-tenant|^priority$",
                       env={"MODELPLEX_PLUGINS": "onnx,python"}) as s:
        yield s


def post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(f"http://{server.http_url}{path}", timeout=30, **kwargs)


# ---- raw binary requests ----------------------------------------------------------------------
def test_raw_binary_request_is_the_one_inputs_bytes(server):
    data = np.arange(6, dtype=np.float32)
    answer = post(server, "/v2/models/raw_fp32/infer", content=data.tobytes(),
                  headers={"Inference-Header-Content-Length": "0"})
    assert answer.status_code == 200, answer.text
    result = httpclient.InferenceServerClient.parse_response_body(
        answer.content, header_length=int(answer.headers["inference-header-content-length"]))
    assert result.get_output("Y")["shape"] == [1, 6]  # batch 1, the variable dim from the body's size
    np.testing.assert_array_equal(result.as_numpy("Y"), data[None])  # outputs binary, as Triton's


def test_raw_binary_bytes_input_is_one_element(server):
    answer = post(server, "/v2/models/raw_bytes/infer", content=b"hello raw",
                  headers={"Inference-Header-Content-Length": "0"})
    result = httpclient.InferenceServerClient.parse_response_body(
        answer.content, header_length=int(answer.headers["inference-header-content-length"]))
    assert result.as_numpy("Y").tolist() == [b"hello raw"]


@pytest.mark.parametrize("model, body, words", [
    ("simple", b"\0" * 128, "Raw request must only have 1 input"),
    ("raw_fp32", b"\0" * 7, "do not fill a whole number of FP32 elements")])
def test_raw_binary_request_that_cannot_be_deduced_is_refused(server, model, body, words):
    answer = post(server, f"/v2/models/{model}/infer", content=body, headers={"Inference-Header-Content-Length": "0"})
    assert answer.status_code == 400 and words in answer.json()["error"]


# ---- generate: fields shaped to the model's dims ------------------------------------------------
@pytest.mark.parametrize("model", ["echo", "echo_batched"])
def test_generate_fills_a_one_element_shape_from_a_scalar(server, model):
    answer = post(server, f"/v2/models/{model}/generate", json={"PROMPT": "hello world", "STREAM": False})
    assert answer.status_code == 200, answer.text
    assert answer.json()["TEXT"] == "hello world"


def test_generate_refuses_values_that_cannot_fill_the_shape(server):
    answer = post(server, "/v2/models/echo/generate", json={"PROMPT": "x", "STREAM": [True, False]})
    assert answer.status_code == 400
    assert answer.json()["error"] == "The schema can not convert input 'STREAM' to tensor with proper shape"


# ---- codes and words ----------------------------------------------------------------------------
@pytest.mark.parametrize("body", [b"", b"not json", b'{"inputs": []}'])
def test_an_unknown_models_infer_is_404_whatever_the_body(server, body):
    answer = post(server, "/v2/models/nope/infer", content=body)
    assert (answer.status_code, answer.json()) == (404, {"error": "Request for unknown model: 'nope' is not found"})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_model_words_and_duplicate_outputs(server, protocol):
    c = client(server, protocol)
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        c.get_model_metadata("nope")
    module = httpclient if protocol == "http" else grpcclient
    inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
    outputs = [module.InferRequestedOutput("OUTPUT0") for _ in range(2)]
    with pytest.raises(InferenceServerException, match="output 'OUTPUT0' already exists in request") as e:
        c.infer("simple", inputs, outputs=outputs)
    assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_failed_load_says_failed_to_load(server, protocol):
    with pytest.raises(InferenceServerException, match="failed to load 'broken': .*model.onnx is not a file"):
        client(server, protocol).load_model("broken")
    with pytest.raises(InferenceServerException, match="failed to load 'absent'"):
        client(server, protocol).load_model("absent")
    with pytest.raises(InferenceServerException) as e:  # a file name longer than NAME_MAX (NVIDIA's example)
        client(server, protocol).load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
    assert e.value.status() in ("500", "StatusCode.INTERNAL") and "/tmp" not in e.value.message()
    assert "failed to load 'simple', failed to poll from model repository" in e.value.message()
    assert client(server, protocol).is_model_ready("simple")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_load_outside_explicit_mode_is_unavailable_in_tritons_words(example_repo, protocol):
    with ServerProcess([example_repo]) as s:  # model control mode none
        with pytest.raises(InferenceServerException,
                           match="explicit model load / unload is not allowed if polling is enabled") as e:
            client(s, protocol).load_model("simple")
    assert e.value.status() in ("503", "StatusCode.UNAVAILABLE")


# ---- --http-header-forward-pattern -------------------------------------------------------------
def test_matching_headers_reach_the_model_as_parameters(server):
    c = httpclient.InferenceServerClient(server.http_url)
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], np.int32))
    result = c.infer("params", [x], headers={"X-Tenant-Id": "acme", "X-Other": "no"})
    assert json.loads(result.as_numpy("PARAMS")[0]) == {"x-tenant-id": "acme"}
    with pytest.raises(InferenceServerException, match="Header 'priority' is reserved for Triton usage"):
        c.infer("params", [x], headers={"priority": "1"})
