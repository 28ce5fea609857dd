"""TorchScript and torch.export models served by the PyTorch backend through Triton's own clients:
the same answers as calling the module directly, Triton's naming rules, auto-complete from an exported
program, dynamic batching, execution modes, and broken models refused with their reason."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from build_repository import add_sub_torchscript
from helpers.infer_clients import PROTOCOLS, client, infer, model_config, repository_index
from helpers.pytorch_models import BATCHED, SIMPLE, Scaled, scaled_example


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("batch", [1, 8])
def test_named_index_inputs_and_tuple_outputs_match_the_module(server, protocol, batch):
    rng = np.random.default_rng(batch)
    a = rng.integers(-1000, 1000, (batch, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (batch, 16), dtype=np.int32)
    result = infer(server, protocol, SIMPLE, {"INPUT__0": a, "INPUT__1": b})
    expected = add_sub_torchscript()(torch.from_numpy(a), torch.from_numpy(b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), expected[0].numpy())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), expected[1].numpy())
    assert result.as_numpy("OUTPUT__0").dtype == np.int32


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["scaled", "exported"])
def test_forward_argument_names_and_dict_outputs_match_the_module(server, protocol, model):
    features, scale = scaled_example()
    result = infer(server, protocol, model, {"scale": scale.numpy(), "features": features.numpy()})
    expected = Scaled()(features, scale)
    np.testing.assert_allclose(result.as_numpy("scaled"), expected["scaled"].numpy())
    np.testing.assert_allclose(result.as_numpy("total"), expected["total"].numpy())
    only_total = infer(server, protocol, model, {"features": features.numpy(), "scale": scale.numpy()},
                       outputs=["total"])
    assert only_total.as_numpy("scaled") is None
    np.testing.assert_allclose(only_total.as_numpy("total"), expected["total"].numpy())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_exported_program_config_is_completed_from_its_signature(server, protocol):
    config = model_config(server, protocol, "exported")
    assert config["platform"] == "pytorch_libtorch" and config["default_model_filename"] == "model.pt2"
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config  # the batch dim is dynamic
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]] == [
        ("features", "TYPE_FP32", [3]), ("scale", "TYPE_FP32", [1])]
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config["output"]] == [
        ("scaled", "TYPE_FP32", [3]), ("total", "TYPE_FP32", [1])]


def test_metadata_names_the_pytorch_platform(server):
    metadata = client(server, "http").get_model_metadata(SIMPLE)
    assert metadata["platform"] == "pytorch_libtorch"
    assert [(t["name"], t["shape"]) for t in metadata["inputs"]] == [("INPUT__0", [-1, 16]), ("INPUT__1", [-1, 16])]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_dynamic_batching_runs_concurrent_requests_together(server, protocol):
    stats = lambda: client(server, "http").get_inference_statistics(BATCHED)["model_stats"][0]
    before = stats()
    arrays = [np.full((1, 16), i, dtype=np.int32) for i in range(8)]
    barrier = threading.Barrier(len(arrays))

    def one(a):
        barrier.wait()
        return infer(server, protocol, BATCHED, {"INPUT__0": a, "INPUT__1": np.ones_like(a)})

    with ThreadPoolExecutor(len(arrays)) as pool:
        results = list(pool.map(one, arrays))
    for a, result in zip(arrays, results):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + 1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - 1)
    after = stats()
    assert after["inference_count"] - before["inference_count"] == 8
    executions = after["execution_count"] - before["execution_count"]
    assert executions < 8, f"{executions} forward() calls for 8 requests"
    assert max(int(b["batch_size"]) for b in after["batch_stats"]) > 1


@pytest.mark.parametrize(("model", "expected"), [
    ("modes", [1, 0]),  # Triton's default: torch.inference_mode()
    ("modes_no_inference", [0, 0]),  # INFERENCE_MODE false: torch.no_grad() (and thread, JIT settings load)
])
def test_forward_runs_under_the_configured_grad_mode(server, model, expected):
    x = np.zeros((2, 1), dtype=np.float32)
    result = infer(server, "grpc", model, {"x": x})
    np.testing.assert_array_equal(result.as_numpy("sum__0"), x + 1)
    assert result.as_numpy("modes__1").tolist() == [expected] * 2


@pytest.mark.parametrize(("model", "reason"), [
    ("missing_file", "model.pt is not a file"),
    ("wrong_input_count", "config.pbtxt has 3 input(s) but the model's forward() takes 2 (a, b)"),
    ("bytes_input", "input 'INPUT__1' is TYPE_STRING (BYTES)"),
    ("torchscript_without_config", "TorchScript model does not reveal its tensors' types and shapes"),
    ("bad_parameter", "parameter 'INFERENCE_MODE' must be true or false, got 'maybe'"),
])
def test_broken_models_fail_their_load_with_the_reason_and_others_keep_serving(server, model, reason):
    row = repository_index(server)[model]
    assert row["state"] == "UNAVAILABLE" and reason in row["reason"], row
    a = np.ones((1, 16), dtype=np.int32)
    result = infer(server, "grpc", SIMPLE, {"INPUT__0": a, "INPUT__1": a})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a * 2)


def test_gpu_instances_need_cuda(server):
    row = repository_index(server)["gpu_instance"]
    if torch.cuda.is_available():
        assert row["state"] == "READY", row
        a = np.ones((2, 16), dtype=np.int32)
        result = infer(server, "http", "gpu_instance", {"INPUT__0": a, "INPUT__1": a})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a * 0)
    else:
        assert row["state"] == "UNAVAILABLE" and "KIND_GPU needs CUDA" in row["reason"], row
