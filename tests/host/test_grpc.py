"""The gRPC front door of a real server, driven by tritonclient.grpc and the raw generated stub:
health, metadata, inference (raw and typed contents, BYTES, batches), streaming, statistics, repository, errors."""
from __future__ import annotations

import queue

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


@pytest.fixture(scope="module")
def client(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        yield c


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.grpc_url) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel):
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="module")
def health(channel):
    return health_pb2_grpc.HealthStub(channel)


def inputs(a=A, b=B, datatype="INT32"):
    tensors = [grpcclient.InferInput("INPUT0", list(a.shape), datatype),
               grpcclient.InferInput("INPUT1", list(b.shape), datatype)]
    tensors[0].set_data_from_numpy(a)
    tensors[1].set_data_from_numpy(b)
    return tensors


def assert_simple_works(client):
    result = client.infer("simple", inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)


def raises_code(code: str, match: str):
    return pytest.raises(InferenceServerException, match=f"\\[StatusCode.{code}\\] .*{match}")


def health_status(health, service: str) -> int:
    return health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


# ---- health and metadata ----------------------------------------------------------------
def test_live_ready_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "modelplex" and "model_repository" in meta["extensions"]


def test_model_metadata_and_readiness(client):
    meta = client.get_model_metadata("simple", as_json=True)
    assert (meta["name"], meta["versions"], meta["platform"]) == ("simple", ["1"], "onnxruntime_onnx")
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("INPUT0", "INT32", ["-1", "16"]), ("INPUT1", "INT32", ["-1", "16"])]
    assert client.get_model_metadata("simple", "1", as_json=True) == meta
    assert client.is_model_ready("simple") and client.is_model_ready("simple", "1")
    assert not client.is_model_ready("nope") and not client.is_model_ready("simple", "7")
    with raises_code("NOT_FOUND", "Request for unknown model: 'nope' is not found"):
        client.get_model_metadata("nope")


def test_model_config(client):
    config = client.get_model_config("simple").config
    assert (config.name, config.max_batch_size, config.backend) == ("simple", 8, "onnx")
    assert [t.name for t in config.input] == ["INPUT0", "INPUT1"] and list(config.input[0].dims) == [16]
    with raises_code("NOT_FOUND", "Request for unknown model: 'nope' is not found"):
        client.get_model_config("nope")


def test_health_checks_follow_server_and_model_readiness(health):
    assert health_status(health, "") == health_pb2.HealthCheckResponse.SERVING
    assert health_status(health, "inference.GRPCInferenceService") == health_pb2.HealthCheckResponse.SERVING
    assert health_status(health, "simple") == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as e:
        health_status(health, "nope")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    watch = health.Watch(health_pb2.HealthCheckRequest(service="simple"), timeout=10)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


# ---- inference --------------------------------------------------------------------------
def test_infer_simple_with_raw_contents_echoes_the_id(client):
    result = client.infer("simple", inputs(), request_id="req-42", parameters={"note": "x", "n": 3})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("req-42", "simple", "1")
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]


def test_only_requested_outputs_come_back(client):
    result = client.infer("simple", inputs(), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_batch_of_eight_and_nine(client):
    rng = np.random.default_rng(8)
    a, b = (rng.integers(-100, 100, (8, 16), dtype=np.int32) for _ in range(2))
    result = client.infer("simple", inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert list(result.get_response().outputs[0].shape) == [8, 16]
    nine = np.zeros((9, 16), dtype=np.int32)
    with raises_code("INVALID_ARGUMENT", "max_batch_size 8"):
        client.infer("simple", inputs(nine, nine))


def test_typed_contents_through_the_raw_stub(stub):
    request = pb.ModelInferRequest(model_name="simple", id="typed")
    for name, values in (("INPUT0", A), ("INPUT1", B)):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(values.flatten().tolist())
    response = stub.ModelInfer(request, timeout=10)
    result = grpcclient.InferResult(response)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    assert response.id == "typed" and len(response.raw_output_contents) == 2


def test_bytes_on_simple_string_raw_and_typed(client, stub):
    as_bytes = np.vectorize(lambda v: str(v).encode(), otypes=[np.object_])
    result = client.infer("simple_string", inputs(as_bytes(A), as_bytes(B), "BYTES"))
    assert result.as_numpy("OUTPUT0").tolist() == as_bytes(A + B).tolist()
    request = pb.ModelInferRequest(model_name="simple_string")
    for name, values in (("INPUT0", A), ("INPUT1", B)):
        tensor = request.inputs.add(name=name, datatype="BYTES", shape=[1, 16])
        tensor.contents.bytes_contents.extend(as_bytes(values).flatten().tolist())
    typed = grpcclient.InferResult(stub.ModelInfer(request, timeout=10))
    assert typed.as_numpy("OUTPUT1").tolist() == as_bytes(A - B).tolist()


def test_stream_serves_requests_and_reports_errors_in_band(client):
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("simple", inputs(), request_id="s1", enable_empty_final_response=True)
        first, first_error = results.get(timeout=10)
        client.async_stream_infer("nope", inputs(), request_id="s2")
        _, error = results.get(timeout=10)
        client.async_stream_infer("simple", inputs(B, A), request_id="s3")
        last, last_error = results.get(timeout=10)
    finally:
        client.stop_stream()
    assert results.empty(), "a non-decoupled model's one response is final: no empty final response follows"
    assert first_error is None and first.get_response().id == "s1"
    np.testing.assert_array_equal(first.as_numpy("OUTPUT0"), A + B)
    assert first.get_response().parameters["triton_final_response"].bool_param is True
    assert "Request for unknown model: 'nope' is not found" in str(error)
    assert last_error is None and last.get_response().id == "s3"
    np.testing.assert_array_equal(last.as_numpy("OUTPUT1"), B - A)


# ---- bad input: a clear error, and the next good request still works ---------------------
def test_unknown_model_is_not_found(client):
    with raises_code("NOT_FOUND", "Request for unknown model: 'nope' is not found"):
        client.infer("nope", inputs())
    assert_simple_works(client)


@pytest.mark.parametrize("make, match", [
    (lambda: inputs(A.astype(np.float32), B.astype(np.float32), "FP32"),
     "has datatype FP32, model 'simple' expects INT32"),
    (lambda: inputs(A[:, :8], B[:, :8]), r"Expected \[-1, 16\], got \[1, 8\]"),
    (lambda: inputs()[:1], "expected input 'INPUT1' for model 'simple' is missing"),
    (lambda: inputs() + [grpcclient.InferInput("EXTRA", [1], "INT32").set_data_from_numpy(np.zeros(1, np.int32))],
     "unexpected inference input 'EXTRA'"),
], ids=["dtype", "shape", "missing", "extra"])
def test_bad_inputs_are_invalid_argument(client, make, match):
    with raises_code("INVALID_ARGUMENT", match):
        client.infer("simple", make())
    assert_simple_works(client)


def test_raw_content_length_mismatch_is_invalid_argument(stub, client):
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(A.tobytes()[:60])
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(request, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == "unexpected total byte size 60 for input 'INPUT0', expecting 64"
    assert_simple_works(client)


def test_a_request_over_grpcs_default_4mb_limit_reaches_the_data_plane(client):
    big = grpcclient.InferInput("BIG", [6 * 1024 * 1024], "INT8")
    big.set_data_from_numpy(np.zeros(6 * 1024 * 1024, np.int8))
    with raises_code("INVALID_ARGUMENT", "unexpected inference input 'BIG'"):
        client.infer("simple", inputs() + [big])


def test_shared_memory_rpcs_answer_as_triton_does_by_default(client):
    """Client shared memory is off unless --allow-client-shm (tests/host/test_shared_memory.py has it on)."""
    assert len(client.get_system_shared_memory_status().regions) == 0
    with raises_code("UNIMPLEMENTED", "Client shared memory is disabled"):
        client.register_system_shared_memory("r", "/k", 8)
    with raises_code("UNIMPLEMENTED", "Client shared memory is disabled"):
        client.unregister_cuda_shared_memory()


# ---- statistics and repository ----------------------------------------------------------
def test_statistics_count_inferences(client):
    before = client.get_inference_statistics("simple").model_stats[0]
    for _ in range(3):
        assert_simple_works(client)
    after = client.get_inference_statistics("simple").model_stats[0]
    assert (after.name, after.version) == ("simple", "1")
    assert after.inference_count == before.inference_count + 3
    assert after.inference_stats.success.count == before.inference_stats.success.count + 3
    every = client.get_inference_statistics(as_json=True)["model_stats"]
    assert [s["name"] for s in every] == ["simple", "simple_string"]
    with raises_code("NOT_FOUND", "model 'nope' is not found"):
        client.get_inference_statistics("nope")


def test_repository_index(client):
    index = client.get_model_repository_index(as_json=True)["models"]
    assert index == [{"name": "simple", "version": "1", "state": "READY"},
                     {"name": "simple_string", "version": "1", "state": "READY"}]


# ---- load / unload / reload (last: they change the server's models) ----------------------
def test_load_with_a_config_override_then_reload_from_the_repository(client):
    client.load_model("simple", config='{"max_batch_size": "16"}')
    assert client.get_model_config("simple").config.max_batch_size == 16
    sixteen = np.ones((16, 16), dtype=np.int32)
    np.testing.assert_array_equal(client.infer("simple", inputs(sixteen, sixteen)).as_numpy("OUTPUT0"), sixteen * 2)
    client.load_model("simple")
    assert client.get_model_config("simple").config.max_batch_size == 8
    assert_simple_works(client)


def test_load_from_files_sent_in_the_request(client, example_repo):
    onnx_bytes = (example_repo / "simple" / "1" / "model.onnx").read_bytes()
    config = '{"name": "uploaded", "backend": "onnx", "max_batch_size": 8}'
    client.load_model("uploaded", config=config, files={"file:1/model.onnx": onnx_bytes})
    result = client.infer("uploaded", inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    client.unload_model("uploaded")
    assert not client.is_model_ready("uploaded")


def test_bad_load_requests_are_refused(client, stub):
    with raises_code("NOT_FOUND", "nope"):
        client.load_model("nope")
    request = pb.RepositoryModelLoadRequest(model_name="simple")
    request.parameters["bogus"].string_param = "1"
    with pytest.raises(grpc.RpcError) as e:
        stub.RepositoryModelLoad(request, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown load parameter 'bogus'" in e.value.details()
    request = pb.RepositoryModelLoadRequest(model_name="simple")
    request.parameters["config"].bool_param = True
    with pytest.raises(grpc.RpcError) as e:
        stub.RepositoryModelLoad(request, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'config' must be a string" in e.value.details()
    assert_simple_works(client)


def test_unload_makes_the_model_and_its_health_not_serving_until_loaded_again(client, health):
    client.unload_model("simple_string", unload_dependents=True)
    assert not client.is_model_ready("simple_string")
    assert health_status(health, "simple_string") == health_pb2.HealthCheckResponse.NOT_SERVING
    with raises_code("NOT_FOUND", "Request for unknown model: 'simple_string' has no available versions"):
        client.infer("simple_string", inputs(A.astype(np.object_), B.astype(np.object_), "BYTES"))
    client.load_model("simple_string")
    assert client.is_model_ready("simple_string")
    assert health_status(health, "simple_string") == health_pb2.HealthCheckResponse.SERVING
