"""Python models that misbehave: each failure is a clear error naming the model, and nothing else is affected."""
from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from helpers.python_clients import http_infer, inputs, stream, text
from tritonclient.utils import InferenceServerException


def eventually(check, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("mode, status, message", [
    ("raise", "500", "model 'faulty' failed in execute: ValueError: the model broke on purpose"),
    ("error", "400", "model 'faulty': MODE is not valid"),
    ("count", "500", "execute returned 2 responses for 1 request(s)"),
    ("none", "500", "execute returned NoneType for 1 request(s)"),
    ("not_tensor", "500", "output_tensors must hold pb_utils.Tensor objects, got list"),
    ("twice", "500", "a model that is not decoupled sends one response per request"),
])
def test_a_misbehaving_execute_fails_only_its_request(python_server, mode, status, message):
    with pytest.raises(httpclient.InferenceServerException) as e:
        http_infer(python_server, "faulty", MODE=text(mode))
    assert e.value.status() == status
    assert message in e.value.message() and "faulty" in e.value.message()
    if mode == "raise":  # the whole traceback goes to the server's log, marked with the instance
        assert eventually(lambda: "[faulty_0_0] ValueError: the model broke on purpose" in python_server.log())
    # The same worker keeps serving.
    assert http_infer(python_server, "faulty", MODE=text("ok")).as_numpy("OUT").tolist() == [1.0]


def test_a_model_that_is_not_decoupled_may_answer_through_the_response_sender(python_server):
    assert http_infer(python_server, "faulty", MODE=text("sender")).as_numpy("OUT").tolist() == [1.0]


@pytest.mark.parametrize("mode, problem", [("dtype", "as FP64; its config declares FP32"),
                                           ("shape", "of shape [2, 2]; its config declares [1]")])
def test_an_output_other_than_declared_is_an_error_naming_it(python_server, mode, problem):
    # A client reading the output as its config declares it would misread the bytes: a 500, not a 200.
    with pytest.raises(InferenceServerException) as failed:
        http_infer(python_server, "faulty", MODE=text(mode))
    assert f"model 'faulty' returned output 'OUT' {problem}" in failed.value.message()
    assert failed.value.status() == "500"
    # The same worker keeps serving.
    assert http_infer(python_server, "faulty", MODE=text("ok")).as_numpy("OUT").tolist() == [1.0]


def test_a_failing_initialize_fails_the_load_with_its_message(python_server):
    client = httpclient.InferenceServerClient(python_server.http_url)
    with pytest.raises(httpclient.InferenceServerException) as e:
        client.load_model("init_fails")
    assert "init_fails" in e.value.message() and "no weights for this model" in e.value.message()
    row = next(r for r in client.get_model_repository_index() if r["name"] == "init_fails")
    assert row["state"] == "UNAVAILABLE" and "no weights for this model" in row["reason"]
    assert client.is_model_ready("add_sub")


def test_a_decoupled_model_is_only_streamed(python_server):
    with pytest.raises(httpclient.InferenceServerException) as e:
        http_infer(python_server, "square_int32", IN=np.array([1], np.int32))
    assert e.value.status() == "400" and "decoupled" in e.value.message()


def test_a_decoupled_execute_that_raises_is_an_error_in_the_stream(python_server):
    responses = stream(python_server, "repeat_int32", [
        {"IN": np.array([1, 2], np.int32), "DELAY": np.array([1], np.uint32), "WAIT": np.array([0], np.uint32)}])
    assert len(responses["0"]) == 1
    assert "repeat_int32" in responses["0"][0] and "IN and DELAY shapes differ" in responses["0"][0]
    # The instance is free again: a good request on a new stream is answered in full.
    good = stream(python_server, "repeat_int32", [
        {"IN": np.array([7], np.int32), "DELAY": np.array([0], np.uint32), "WAIT": np.array([0], np.uint32)}])
    assert [int(r.as_numpy("OUT")[0]) for r in good["0"][:-1]] == [7]


def test_inputs_the_config_does_not_declare_never_reach_the_worker(python_server):
    client = grpcclient.InferenceServerClient(python_server.grpc_url)
    with pytest.raises(grpcclient.InferenceServerException) as e:
        client.infer("add_sub", inputs(grpcclient, INPUT0=np.ones(4, np.float32), INPUT9=np.ones(4, np.float32)))
    assert "INPUT9" in e.value.message()


def test_a_decoupled_model_that_never_sends_the_final_flag_fails_its_stream_in_time(python_server):
    responses = stream(python_server, "forgetful", [{"IN": np.array([0], np.int32)}])["0"]
    assert int(responses[0].as_numpy("OUT")[0]) == 7
    assert len(responses) == 2 and "model 'forgetful' sent no response (and no final flag) within 1 s" in responses[1]
    # Its execute had returned: the worker is not hung, so the model stays up.
    assert httpclient.InferenceServerClient(python_server.http_url).is_model_ready("forgetful")
    wrong = stream(python_server, "forgetful", [{"IN": np.array([1], np.int32)}])["0"]
    assert len(wrong) == 1 and "decoupled model's execute must return None" in wrong[0]


def test_models_sent_through_the_load_api_run_and_broken_ones_fail_to_load(python_server):
    """tritonclient's load_model with a config and files: a Python model needs no repository folder."""
    client = httpclient.InferenceServerClient(python_server.http_url)
    config = ('{"name": "uploaded", "backend": "python", "input": [{"name": "X", "data_type": "TYPE_INT32", '
              '"dims": [1]}], "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}]}')
    model = (b"import triton_python_backend_utils as pb_utils\n"
             b"class TritonPythonModel:\n"
             b"    def execute(self, requests):\n"
             b"        return [pb_utils.InferenceResponse([pb_utils.Tensor('Y', 2 * pb_utils.get_input_tensor_by_name(r, 'X')"
             b".as_numpy())]) for r in requests]\n")
    client.load_model("uploaded", config=config, files={"file:1/model.py": model})
    assert http_infer(python_server, "uploaded", X=np.array([21], np.int32)).as_numpy("Y").tolist() == [42]
    with pytest.raises(httpclient.InferenceServerException) as e:
        client.load_model("uploaded", config=config, files={"file:1/model.py": b"def broken(:\n"})
    assert "SyntaxError" in e.value.message() and "uploaded" in e.value.message()
    # The version that loaded before keeps serving (a reload brings new versions up before old ones go).
    assert http_infer(python_server, "uploaded", X=np.array([1], np.int32)).as_numpy("Y").tolist() == [2]
    client.unload_model("uploaded")
