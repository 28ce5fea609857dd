"""Python models written for Triton's Python backend, served unchanged: plain, async, BLS, decoupled, auto-complete."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from helpers.python_clients import http_infer, inputs, stream, text


@pytest.mark.parametrize("protocol", [httpclient, grpcclient])
def test_add_sub_answers_sum_and_difference(python_server, protocol):
    a = np.array([1.5, 2, 3, 4], np.float32)
    b = np.array([0.5, 5, 1, -4], np.float32)
    url = python_server.http_url if protocol is httpclient else python_server.grpc_url
    result = protocol.InferenceServerClient(url).infer("add_sub", inputs(protocol, INPUT0=a, INPUT1=b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_initialize_gets_tritons_args_in_a_process_of_its_own(python_server, python_repo):
    result = http_infer(python_server, "whoami", X=np.zeros(1, np.int32))
    args = json.loads(result.as_numpy("ARGS")[0])
    assert {k: args[k] for k in ("model_name", "model_version", "model_instance_name", "model_instance_kind",
                                 "model_instance_device_id", "model_repository")} == {
        "model_name": "whoami", "model_version": "1", "model_instance_name": "whoami_0_0",
        "model_instance_kind": "CPU", "model_instance_device_id": "0",
        "model_repository": str(python_repo / "whoami")}
    config = json.loads(args["model_config"])
    assert config["name"] == "whoami" and config["backend"] == "python"
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("X", "TYPE_INT32", [1])]
    pid = int(result.as_numpy("PID")[0])
    assert pid not in (os.getpid(), python_server.proc.pid)
    with open(f"/proc/{pid}/status") as status:
        parent = next(line for line in status if line.startswith("PPid:"))
    assert int(parent.split()[1]) == python_server.proc.pid  # a worker of this server


def test_bls_sync_calls_another_python_model(python_server):
    a = np.array([1, 2, 3, 4], np.float32)
    b = np.array([4, 3, 2, 1], np.float32)
    result = http_infer(python_server, "bls_sync", MODEL_NAME=text("add_sub"), INPUT0=a, INPUT1=b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bls_error_comes_back_to_the_calling_model(python_server):
    a = np.ones(4, np.float32)
    with pytest.raises(httpclient.InferenceServerException) as e:
        http_infer(python_server, "bls_sync", MODEL_NAME=text("no_such_model"), INPUT0=a, INPUT1=a)
    assert e.value.status() == "500"
    assert "model 'bls_sync'" in e.value.message() and "no_such_model" in e.value.message()


def test_async_execute_runs_two_bls_calls_to_the_onnx_model(python_server):
    a = np.arange(16, dtype=np.int32)
    b = np.full(16, 3, np.int32)
    result = http_infer(python_server, "bls_async", INPUT0=a, INPUT1=b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), b - a)


def test_decoupled_repeat_streams_each_value_then_the_final_flag(python_server):
    values = np.array([4, 2, 0, 1], np.int32)
    responses = stream(python_server, "repeat_int32", [
        {"IN": values, "DELAY": np.array([1, 2, 3, 4], np.uint32), "WAIT": np.array([2], np.uint32)},
        {"IN": np.zeros(0, np.int32), "DELAY": np.zeros(0, np.uint32), "WAIT": np.array([0], np.uint32)}])
    first = responses["0"]
    assert first[-1] == "FINAL" and len(first) == len(values) + 1
    assert [(int(r.as_numpy("IDX")[0]), int(r.as_numpy("OUT")[0])) for r in first[:-1]] == list(enumerate(values))
    assert responses["1"] == ["FINAL"]  # IN of shape [0]: no response, only the final flag


def test_decoupled_square_and_a_bls_sum_over_its_stream(python_server):
    responses = stream(python_server, "square_int32", [{"IN": np.array([3], np.int32)}])["0"]
    assert [int(r.as_numpy("OUT")[0]) for r in responses[:-1]] == [3, 3, 3] and responses[-1] == "FINAL"
    result = http_infer(python_server, "sum_squares", IN=np.array([4], np.int32))
    assert result.as_numpy("SUM").tolist() == [16]


def test_auto_complete_config_declares_inputs_outputs_and_batching(python_server):
    client = httpclient.InferenceServerClient(python_server.http_url)
    config = client.get_model_config("auto_add")
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("A", "TYPE_FP32", [2]), ("B", "TYPE_FP32", [2])]
    a = np.array([[1, 2], [3, 4]], np.float32)
    result = http_infer(python_server, "auto_add", A=a, B=a)
    np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * a)


def test_dynamic_batching_hands_execute_several_requests(python_server):
    from concurrent.futures import ThreadPoolExecutor

    def one(x: int):
        try:
            return int(http_infer(python_server, "batch_counter", X=np.array([[x]], np.int32)).as_numpy("N")[0, 0])
        except httpclient.InferenceServerException as e:
            return e.status(), e.message()

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, [1, 1, -1, 1]))
    assert answers[2] == ("400", "model 'batch_counter': X must not be negative")
    counts = [answers[i] for i in (0, 1, 3)]
    assert all(isinstance(n, int) and n >= 1 for n in counts), answers
    # Run together, a batch fails as a whole and the batcher reruns its requests one by one; so
    # batching shows on a second round without the bad request.
    with ThreadPoolExecutor(4) as pool:
        assert max(pool.map(one, [1, 1, 1, 1])) > 1


def test_a_model_loads_and_unloads_other_models(python_server):
    steps = http_infer(python_server, "model_control", NAME=text("spare")).as_numpy("STEPS")
    assert [s.decode() for s in steps] == ["ready before: False", "ready after load: True",
                                           "ready after unload: False"]
    steps = http_infer(python_server, "model_control", NAME=text("no_such_model")).as_numpy("STEPS")
    assert steps[0] == b"ready before: False"
    assert steps[1].startswith(b"error: ") and b"no_such_model" in steps[1]


def test_one_decoupled_instance_streams_several_requests_at_once(python_server):
    """Triton's repeat example: execute returns after WAIT while its thread keeps sending, so the next
    request starts on the same (only) instance and the responses of both interleave."""
    slow = {"IN": np.array([1, 2, 3], np.int32), "DELAY": np.array([200, 200, 200], np.uint32),
            "WAIT": np.array([0], np.uint32)}
    order: list = []
    responses = stream(python_server, "repeat_int32", [slow, slow], order=order)
    for request_id in ("0", "1"):
        assert [int(r.as_numpy("OUT")[0]) for r in responses[request_id][:-1]] == [1, 2, 3]
    assert order.index("1") < len(order) - 1 - order[::-1].index("0"), f"no interleaving: {order}"
