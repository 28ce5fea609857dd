"""Issue 29, confinement and shapes: a config override cannot point a backend at a file outside the
repository, and shapes numpy cannot hold are a 400 naming the problem on HTTP and gRPC (they were 500s
with a traceback)."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from helpers.serverproc import ServerProcess
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

ZERO_SIZE_HUGE = [0, 4611686018427387904]
TOO_MANY_DIMS = [1] * 65


@pytest.fixture(scope="module")
def server(example_repo):
    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "simple",
                       env={"MODELPLEX_PLUGINS": "onnx"}) as s:
        yield s


@pytest.mark.parametrize("shape, problem", [(TOO_MANY_DIMS, "has 65 dimensions; a tensor may have at most 64"),
                                            (ZERO_SIZE_HUGE, "has a dimension of 4611686018427387904")])
def test_shapes_numpy_cannot_hold_are_a_400_naming_the_problem(server, shape, problem):
    body = {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "INT32", "data": []},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}]}
    r = httpx.post(f"http://{server.http_url}/v2/models/simple/infer", json=body, timeout=30)
    assert r.status_code == 400 and problem in r.json()["error"] and "input 'INPUT0'" in r.json()["error"]

    client = grpcclient.InferenceServerClient(server.grpc_url)
    request = service_pb2.ModelInferRequest(model_name="simple")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=shape)
    request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    request.raw_input_contents.extend([b"", np.arange(16, dtype=np.int32).tobytes()])
    with pytest.raises(Exception) as failed:
        client._client_stub.ModelInfer(request, timeout=30)
    assert failed.value.code().name == "INVALID_ARGUMENT" and problem in failed.value.details()
    assert "Traceback" not in server.log()


@pytest.mark.parametrize("filename", ["/etc/passwd", "../../simple/1/model.onnx", "sub/../../x.onnx"])
def test_a_config_override_cannot_name_a_model_file_outside_the_repository(server, filename, example_repo):
    config = json.loads(httpx.get(f"http://{server.http_url}/v2/models/simple/config", timeout=30).text)
    config["default_model_filename"] = filename
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as failed:
        client.load_model("simple_copy", config=json.dumps(config | {"name": "simple_copy"}),
                          files={"file:1/model.onnx": (example_repo / "simple" / "1" / "model.onnx").read_bytes()})
    assert f"default_model_filename {filename!r} is outside the model's version folder" in failed.value.message()
    assert not client.is_model_ready("simple_copy")
    # and a config.pbtxt-less reload of a served model through HTTP's load API alike
    r = httpx.post(f"http://{server.http_url}/v2/repository/models/simple/load",
                   json={"parameters": {"config": json.dumps(config)}}, timeout=60)
    assert r.status_code == 400 and "default_model_filename" in r.json()["error"]
    assert client.is_model_ready("simple")
