"""The HTTP front door of a real server, driven by tritonclient.http and httpx: health, metadata,
config, inference in JSON / binary / mixed, BYTES, batching, output selection, statistics, compression."""
from __future__ import annotations

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


@pytest.fixture(scope="module")
def client(server):
    with httpclient.InferenceServerClient(server.http_url) as c:
        yield c


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as c:
        yield c


def simple_inputs(a=A, b=B, binary=(True, True)):
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "INT32"),
              httpclient.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary[0])
    inputs[1].set_data_from_numpy(b, binary_data=binary[1])
    return inputs


def outputs(*specs):
    return [httpclient.InferRequestedOutput(name, binary_data=binary) for name, binary in specs]


def test_health_and_server_metadata(client, http):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "modelplex" and "binary_tensor_data" in meta["extensions"]
    assert http.get("/v2/health/live").status_code == 200


def test_model_metadata_ready_and_config(client):
    meta = client.get_model_metadata("simple")
    assert meta["name"] == "simple" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
                              {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]}]
    assert client.get_model_metadata("simple", "1") == meta
    assert client.is_model_ready("simple") and client.is_model_ready("simple", "1")
    assert not client.is_model_ready("nope") and not client.is_model_ready("simple", "7")
    config = client.get_model_config("simple")
    assert config["name"] == "simple" and config["max_batch_size"] == 8
    assert [t["name"] for t in config["input"]] == ["INPUT0", "INPUT1"]
    assert config["input"][0]["data_type"] == "TYPE_INT32" and config["input"][0]["dims"] == [16]
    assert client.get_model_config("simple", "1") == config
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found") as e:
        client.get_model_metadata("nope")
    assert e.value.status() == "404"


def test_infer_json_inputs_and_outputs(client, http):
    result = client.infer("simple", simple_inputs(binary=(False, False)),
                          outputs=outputs(("OUTPUT0", False), ("OUTPUT1", False)), request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    assert result.get_response()["id"] == "r1"
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": A.tolist()},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": B.ravel().tolist()}]}
    response = http.post("/v2/models/simple/versions/1/infer", content=orjson.dumps(body))
    assert response.status_code == 200 and "inference-header-content-length" not in response.headers
    assert response.json() == {"model_name": "simple", "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": (A + B).ravel().tolist()},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16], "data": (A - B).ravel().tolist()}]}


def test_infer_binary_by_default(client):
    result = client.infer("simple", simple_inputs())
    for output in result.get_response()["outputs"]:
        assert output["parameters"] == {"binary_data_size": 64} and "data" not in output
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_infer_mixed_binary_and_json(client):
    result = client.infer("simple", simple_inputs(binary=(True, False)),
                          outputs=outputs(("OUTPUT0", True), ("OUTPUT1", False)))
    out0, out1 = result.get_response()["outputs"]
    assert out0["parameters"] == {"binary_data_size": 64} and out1["data"] == (A - B).ravel().tolist()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_on_simple_string(client, binary):
    a = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    b = np.array([[b"1"] * 16], dtype=np.object_)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "BYTES"), httpclient.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    result = client.infer("simple_string", inputs, outputs=outputs(("OUTPUT0", binary), ("OUTPUT1", binary)))
    got0 = [x if isinstance(x, bytes) else x.encode() for x in result.as_numpy("OUTPUT0").ravel()]
    got1 = [x if isinstance(x, bytes) else x.encode() for x in result.as_numpy("OUTPUT1").ravel()]
    assert got0 == [str(i + 1).encode() for i in range(16)]
    assert got1 == [str(i - 1).encode() for i in range(16)]


def test_batch_of_eight_and_output_selection(client):
    a = np.arange(8 * 16, dtype=np.int32).reshape(8, 16)
    b = np.ones((8, 16), dtype=np.int32)
    result = client.infer("simple", simple_inputs(a, b), outputs=outputs(("OUTPUT1", True)))
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None
    with pytest.raises(InferenceServerException, match="batch size 9 exceeds the model's max_batch_size 8") as e:
        client.infer("simple", simple_inputs(np.zeros((9, 16), np.int32), np.zeros((9, 16), np.int32)))
    assert e.value.status() == "400"


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_and_response(client, algorithm):
    result = client.infer("simple", simple_inputs(binary=(True, False)), request_compression_algorithm=algorithm,
                          response_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)


def test_statistics_count_exactly_the_traffic_sent(client, http):
    def stats(name):
        (entry,) = client.get_inference_statistics(name)["model_stats"]
        return entry

    before = stats("simple_string")
    inputs = [httpclient.InferInput(n, [2, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.full((2, 16), b"2", dtype=np.object_))
    for _ in range(3):
        client.infer("simple_string", inputs)
    with pytest.raises(InferenceServerException, match="expected input 'INPUT1'"):  # a failure, no execution
        client.infer("simple_string", inputs[:1])
    after = stats("simple_string")
    assert after["inference_count"] - before["inference_count"] == 6
    assert after["execution_count"] - before["execution_count"] == 3
    success = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    fail = after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"]
    assert (success, fail) == (3, 1)
    batch2 = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}[2]
    assert batch2 == 3 + {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}.get(2, 0)
    assert client.get_inference_statistics("simple_string", "1")["model_stats"][0]["inference_count"] == \
        after["inference_count"]
    everything = client.get_inference_statistics()["model_stats"]
    assert {(s["name"], s["version"]) for s in everything} == {("simple", "1"), ("simple_string", "1")}
    missing = http.get("/v2/models/nope/stats")
    assert missing.status_code == 404 and missing.json() == {"error": "model 'nope' is not found"}


def test_repository_index_lists_the_loaded_models(client, http):
    index = client.get_model_repository_index()
    assert [(m["name"], m["version"], m["state"]) for m in index] == [("simple", "1", "READY"),
                                                                      ("simple_string", "1", "READY")]
    assert http.post("/v2/repository/index", json={"ready": True}).json() == index
    bad = http.post("/v2/repository/index", json={"ready": "yes"})
    assert bad.status_code == 400 and bad.json() == {"error": "'ready' must be true or false"}



def test_shared_memory_routes_answer_as_triton_does_by_default(client):
    assert client.get_system_shared_memory_status() == [] and client.get_cuda_shared_memory_status() == []
    with pytest.raises(InferenceServerException, match="Client shared memory is disabled") as e:
        client.register_system_shared_memory("r", "/k", 8)
    assert e.value.status() == "501"
