"""HTTP and gRPC give the same answer for every endpoint: one server, tritonclient.http against tritonclient.grpc.

gRPC answers are protobuf messages (int64 printed as strings, defaults omitted in JSON), so HTTP's
JSON is parsed into the same message type and the two messages are compared.
"""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

# Which gRPC status each HTTP status of a data-plane error must come with.
HTTP_TO_GRPC = {"400": "StatusCode.INVALID_ARGUMENT", "404": "StatusCode.NOT_FOUND",
                "501": "StatusCode.UNIMPLEMENTED", "503": "StatusCode.UNAVAILABLE"}
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), -5, dtype=np.int32)


@pytest.fixture(scope="module")
def clients(server):
    with httpclient.InferenceServerClient(server.http_url) as h, grpcclient.InferenceServerClient(server.grpc_url) as g:
        yield h, g


def as_message(data: dict, message_type):
    return json_format.ParseDict(data, message_type())


def infer(module, client, model, arrays: dict, datatype="INT32", **kwargs):
    tensors = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return client.infer(model, tensors, **kwargs)


def test_server_metadata_and_health(clients):
    h, g = clients
    assert h.get_server_metadata() == g.get_server_metadata(as_json=True)
    assert (h.is_server_live(), h.is_server_ready()) == (g.is_server_live(), g.is_server_ready()) == (True, True)
    for name, version in (("simple", ""), ("simple", "1"), ("simple", "7"), ("nope", "")):
        assert h.is_model_ready(name, version) == g.is_model_ready(name, version)


@pytest.mark.parametrize("model", ["simple", "simple_string"])
def test_model_metadata(clients, model):
    h, g = clients
    assert as_message(h.get_model_metadata(model), pb.ModelMetadataResponse) == g.get_model_metadata(model)


@pytest.mark.parametrize("model", ["simple", "simple_string"])
def test_model_config(clients, model):
    h, g = clients
    http_config = as_message(h.get_model_config(model), model_config_pb2.ModelConfig)
    assert http_config == g.get_model_config(model).config
    # The JSON form tritonclient.grpc prints is HTTP's config in protobuf's JSON mapping.
    assert g.get_model_config(model, as_json=True)["config"] == json_format.MessageToDict(
        http_config, preserving_proto_field_name=True)


@pytest.mark.parametrize("model, arrays, datatype", [
    ("simple", {"INPUT0": A, "INPUT1": B}, "INT32"),
    ("simple", {"INPUT0": np.tile(A, (8, 1)), "INPUT1": np.tile(B, (8, 1))}, "INT32"),
    ("simple_string", {"INPUT0": A.astype(np.bytes_).astype(np.object_),
                       "INPUT1": B.astype(np.bytes_).astype(np.object_)}, "BYTES"),
], ids=["simple", "simple-batch8", "simple_string"])
def test_infer_results(clients, model, arrays, datatype):
    h, g = clients
    http_result = infer(httpclient, h, model, arrays, datatype, request_id="p-1")
    grpc_result = infer(grpcclient, g, model, arrays, datatype, request_id="p-1")
    http_response, grpc_response = http_result.get_response(), grpc_result.get_response()
    assert (http_response["id"], http_response["model_name"], http_response["model_version"]) == (
        grpc_response.id, grpc_response.model_name, grpc_response.model_version)
    assert [(o["name"], o["datatype"], o["shape"]) for o in http_response["outputs"]] == [
        (o.name, o.datatype, list(o.shape)) for o in grpc_response.outputs]
    for output in ("OUTPUT0", "OUTPUT1"):
        assert http_result.as_numpy(output).tolist() == grpc_result.as_numpy(output).tolist()


def test_statistics(clients):
    h, g = clients
    infer(grpcclient, g, "simple", {"INPUT0": A, "INPUT1": B})
    assert as_message(h.get_inference_statistics("simple"), pb.ModelStatisticsResponse) == \
        g.get_inference_statistics("simple")
    assert as_message(h.get_inference_statistics(), pb.ModelStatisticsResponse) == g.get_inference_statistics()


def test_repository_index(clients):
    h, g = clients
    assert as_message({"models": h.get_model_repository_index()}, pb.RepositoryIndexResponse) == \
        g.get_model_repository_index()


ERRORS = {
    "metadata of an unknown model": lambda m, c: c.get_model_metadata("nope"),
    "metadata of an unknown version": lambda m, c: c.get_model_metadata("simple", "7"),
    "config of an unknown model": lambda m, c: c.get_model_config("nope"),
    "statistics of an unknown model": lambda m, c: c.get_inference_statistics("nope"),
    "infer on an unknown model": lambda m, c: infer(m, c, "nope", {"INPUT0": A, "INPUT1": B}),
    "infer on an unknown version": lambda m, c: infer(m, c, "simple", {"INPUT0": A, "INPUT1": B}, model_version="7"),
    "infer with a bad version": lambda m, c: infer(m, c, "simple", {"INPUT0": A, "INPUT1": B}, model_version="x"),
    "wrong datatype": lambda m, c: infer(m, c, "simple", {"INPUT0": A.astype(np.int64), "INPUT1": B.astype(np.int64)},
                                         "INT64"),
    "wrong shape": lambda m, c: infer(m, c, "simple", {"INPUT0": A[:, :4], "INPUT1": B[:, :4]}),
    "batch too large": lambda m, c: infer(m, c, "simple", {"INPUT0": np.tile(A, (9, 1)), "INPUT1": np.tile(B, (9, 1))}),
    "missing input": lambda m, c: infer(m, c, "simple", {"INPUT0": A}),
    "extra input": lambda m, c: infer(m, c, "simple", {"INPUT0": A, "INPUT1": B, "INPUT2": B}),
    "unknown output": lambda m, c: infer(m, c, "simple", {"INPUT0": A, "INPUT1": B},
                                         outputs=[m.InferRequestedOutput("OUTPUT9")]),
    "unload an unknown model": lambda m, c: c.unload_model("nope"),
    "load an unknown model": lambda m, c: c.load_model("nope"),
    "load with a broken config": lambda m, c: c.load_model("simple", config="{not json"),
}


SHM_DISABLED = {
    "system shared memory": lambda c: c.register_system_shared_memory("r", "/k", 8),
    "CUDA shared memory": lambda c: c.unregister_cuda_shared_memory(),
}


@pytest.mark.parametrize("call", SHM_DISABLED.values(), ids=SHM_DISABLED.keys())
def test_client_shared_memory_off_is_501_and_unimplemented(clients, call):
    h, g = clients
    with pytest.raises(InferenceServerException) as http_error:
        call(h)
    with pytest.raises(InferenceServerException) as grpc_error:
        call(g)
    assert (http_error.value.status(), grpc_error.value.status()) == ("501", "StatusCode.UNIMPLEMENTED")
    assert http_error.value.message() == grpc_error.value.message().split("] ", 1)[-1]


@pytest.mark.parametrize("call", ERRORS.values(), ids=ERRORS.keys())
def test_errors_have_the_same_message_and_matching_codes(clients, call):
    h, g = clients
    with pytest.raises(InferenceServerException) as http_error:
        call(httpclient, h)
    with pytest.raises(InferenceServerException) as grpc_error:
        call(grpcclient, g)
    assert http_error.value.message() == grpc_error.value.message()
    assert HTTP_TO_GRPC[http_error.value.status()] == grpc_error.value.status()
    assert g.is_model_ready("simple") and h.is_model_ready("simple")
