"""Ensembles through the real server and Triton's clients: answers, load-time DAG checks, unload
protection, failing steps, per-step statistics."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


def client(server, protocol):
    return (httpclient.InferenceServerClient(server.http_url) if protocol == "http"
            else grpcclient.InferenceServerClient(server.grpc_url))


def infer(server, protocol, model, a=A, b=B):
    module = httpclient if protocol == "http" else grpcclient
    inputs = [module.InferInput("INPUT0", list(a.shape), "INT32"), module.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return client(server, protocol).infer(model, inputs)


@pytest.fixture(scope="module")
def server(ensemble_repo):
    with ServerProcess([ensemble_repo], "--model-control-mode", "explicit", "--load-model", "ensemble_add_sub",
                       "--load-model", "ensemble_fails") as s:
        yield s


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ensemble_add_sub_answers_sum_and_difference(server, protocol):
    result = infer(server, protocol, "ensemble_add_sub")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    batch_a, batch_b = np.arange(64, dtype=np.int32).reshape(4, 16), np.ones((4, 16), np.int32)
    result = infer(server, protocol, "ensemble_add_sub", batch_a, batch_b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), batch_a + batch_b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), batch_a - batch_b)


def test_loading_the_ensemble_loaded_its_step_model(server):
    assert client(server, "http").is_model_ready("simple")


def test_statistics_time_every_step_and_count_step_models_separately(server):
    http = client(server, "http")
    before = http.get_inference_statistics("simple")["model_stats"][0]["inference_count"]
    infer(server, "http", "ensemble_add_sub")
    stats = http.get_inference_statistics("ensemble_add_sub")["model_stats"][0]
    steps = {s["step"]: s for s in stats["step_stats"]}
    assert sorted(steps) == ["1:simple", "2:simple", "3:simple", "4:simple"]
    assert all(s["count"] == stats["inference_stats"]["success"]["count"] and s["ns"] > 0 for s in steps.values())
    # Each step went through simple's own request path: four more inferences there.
    assert http.get_inference_statistics("simple")["model_stats"][0]["inference_count"] == before + 4
    # gRPC's statistics message has no per-step field; the rest of the answer is the same.
    grpc_stats = client(server, "grpc").get_inference_statistics("ensemble_add_sub", as_json=True)
    assert int(grpc_stats["model_stats"][0]["inference_count"]) >= stats["inference_count"]


BROKEN = {
    "bad_cycle": "ensemble 'bad_cycle': step 1 (model 'simple') is on a cycle: steps 1, 2",
    "bad_unproduced": "ensemble 'bad_unproduced' step 1 (model 'simple'): tensor 'NOWHERE' for its input 'INPUT1' "
                      "is never produced",
    "bad_no_output": "ensemble 'bad_no_output': tensor 'OUTPUT1' for its output is never produced",
    "bad_dtype": "ensemble 'bad_dtype' step 2 (model 'simple_string'): tensor 'SUM' for its input 'INPUT0' must be "
                 "BYTES[-1, 16], but step 1 makes it INT32[-1, 16]",
    "bad_shape": "ensemble 'bad_shape' step 1 (model 'simple'): tensor 'INPUT0' for its input 'INPUT0' must be "
                 "INT32[-1, 16], but an ensemble input makes it INT32[-1, 8]",
    "bad_missing_model": "ensemble 'bad_missing_model' step 2 (model 'no_such_model'): model 'no_such_model' is not "
                         "in the model repository",
    "bad_unknown_input": "ensemble 'bad_unknown_input' step 1 (model 'simple'): input_map names 'INPUT9', which is "
                         "not an input of the model",
    "bad_self": "ensemble 'bad_self' step 2 (model 'bad_self'): models use each other: 'bad_self' uses 'bad_self'",
}


@pytest.mark.parametrize("name", sorted(BROKEN))
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_broken_ensemble_fails_to_load_naming_its_step_and_nothing_else_stops(server, name, protocol):
    with pytest.raises(InferenceServerException) as e:
        client(server, protocol).load_model(name)
    assert BROKEN[name] in e.value.message()
    assert "400" in str(e.value.status()) or "INVALID_ARGUMENT" in str(e.value.status())
    assert not client(server, "http").is_model_ready(name)
    np.testing.assert_array_equal(infer(server, protocol, "simple").as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(infer(server, protocol, "ensemble_add_sub").as_numpy("OUTPUT1"), A - B)


@pytest.mark.parametrize("protocol, status", [("http", "500"), ("grpc", "StatusCode.INTERNAL")])
def test_a_failing_step_fails_the_request_with_500_naming_it_and_the_ensemble_keeps_serving(server, protocol, status):
    with pytest.raises(InferenceServerException) as e:
        infer(server, protocol, "ensemble_fails")
    assert e.value.status() == status
    assert "ensemble 'ensemble_fails' step 2 (model 'fails') failed" in e.value.message()
    assert "cannot be reshaped" in e.value.message()
    # A batch of seven passes the failing model: the same ensemble answers it.
    seven_a, seven_b = np.tile(A, (7, 1)), np.tile(B, (7, 1))
    result = infer(server, protocol, "ensemble_fails", seven_a, seven_b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), seven_a + seven_b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), seven_a - seven_b)


def test_bad_input_to_an_ensemble_is_refused_before_any_step(server):
    with pytest.raises(InferenceServerException, match="unexpected shape for input 'INPUT0'"):
        infer(server, "http", "ensemble_add_sub", np.zeros((1, 8), np.int32), np.zeros((1, 8), np.int32))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_step_model_cannot_be_unloaded_under_its_ensemble_unless_dependents_go_too(ensemble_repo, protocol):
    with ServerProcess([ensemble_repo], "--model-control-mode", "explicit", "--load-model", "ensemble_add_sub") as s:
        c = client(s, protocol)
        with pytest.raises(InferenceServerException) as e:
            c.unload_model("simple")
        assert "model 'simple' is used by loaded model(s) ensemble_add_sub" in e.value.message()
        assert c.is_model_ready("simple") and c.is_model_ready("ensemble_add_sub")
        np.testing.assert_array_equal(infer(s, protocol, "ensemble_add_sub").as_numpy("OUTPUT0"), A + B)

        c.unload_model("simple", unload_dependents=True)
        assert not c.is_model_ready("simple") and not c.is_model_ready("ensemble_add_sub")

        c.load_model("ensemble_add_sub")  # brings simple back first
        assert c.is_model_ready("simple") and c.is_model_ready("ensemble_add_sub")
        c.unload_model("ensemble_add_sub")  # the ensemble alone: its step model stays
        assert c.is_model_ready("simple") and not c.is_model_ready("ensemble_add_sub")

        c.load_model("ensemble_add_sub")
        c.unload_model("ensemble_add_sub", unload_dependents=True)  # Triton: its step models go too
        assert not c.is_model_ready("simple") and not c.is_model_ready("ensemble_add_sub")


def test_reloading_an_ensemble_to_call_itself_is_refused_and_the_loaded_one_keeps_serving(server):
    import json

    http = client(server, "http")
    config = http.get_model_config("ensemble_add_sub")
    config["ensemble_scheduling"]["step"][1]["model_name"] = "ensemble_add_sub"
    with pytest.raises(InferenceServerException) as e:
        http.load_model("ensemble_add_sub", config=json.dumps(config))
    assert "ensemble 'ensemble_add_sub' step 2 (model 'ensemble_add_sub'): models use each other" in e.value.message()
    np.testing.assert_array_equal(infer(server, "grpc", "ensemble_add_sub").as_numpy("OUTPUT0"), A + B)


def test_a_step_model_reloaded_with_other_types_turns_its_ensemble_unavailable_until_it_fits(ensemble_repo):
    """`simple` comes back as a BYTES model (simple_string's file and config under its name): the
    loaded ensemble's steps are checked again at once, and it recovers when `simple` fits again."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    with ServerProcess([ensemble_repo], "--model-control-mode", "explicit", "--load-model", "ensemble_add_sub") as s:
        http = client(s, "http")
        text = (ensemble_repo / "simple_string" / "config.pbtxt").read_text().replace("simple_string", "simple")
        config = json_format.MessageToJson(text_format.Parse(text, model_config_pb2.ModelConfig()))
        model = (ensemble_repo / "simple_string" / "1" / "model.onnx").read_bytes()
        http.load_model("simple", config=config, files={"file:1/model.onnx": model})
        assert http.is_model_ready("simple") and not http.is_model_ready("ensemble_add_sub")
        row = next(r for r in http.get_model_repository_index() if r["name"] == "ensemble_add_sub")
        assert row["state"] == "UNAVAILABLE"
        assert "step 1 (model 'simple')" in row["reason"] and "after 'simple' was reloaded" in row["reason"], row
        with pytest.raises(InferenceServerException) as refused:
            infer(s, "grpc", "ensemble_add_sub")
        assert refused.value.status() == "StatusCode.UNAVAILABLE"

        http.load_model("simple")  # back to the repository's INT32 model
        assert http.is_model_ready("ensemble_add_sub")
        np.testing.assert_array_equal(infer(s, "http", "ensemble_add_sub").as_numpy("OUTPUT0"), A + B)
