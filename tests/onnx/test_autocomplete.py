"""Auto-complete from the ONNX graph and refusal of contradicting configs, on a real server.

One repository holds every case, so one server start covers them all; broken models sit beside
good ones to show a refused config leaves the rest serving.
"""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from build_repository import ONNX_IR_VERSION, ONNX_OPSET, sum_difference_model
from helpers.infer_clients import PROTOCOLS, infer, model_config, repository_index
from helpers.serverproc import ServerProcess
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException


def fp16_bool_model():
    """doubled = x + x (FP16, [batch, n]); negated = not flag (BOOL, [batch, 3])."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["doubled"]), helper.make_node("Not", ["flag"], ["negated"])],
        "fp16_bool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", "n"]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, ["batch", 3])],
        [helper.make_tensor_value_info("doubled", TensorProto.FLOAT16, ["batch", "n"]),
         helper.make_tensor_value_info("negated", TensorProto.BOOL, ["batch", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)], ir_version=ONNX_IR_VERSION)


def fixed_shape_model():
    """y = relu(x) on a fixed [2, 3] FP32 tensor: no batch dimension to find."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "fixed",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)], ir_version=ONNX_IR_VERSION)


def row_sum_model():
    """total = x.sum(axis=1) on [batch, 3] FP32: one scalar per batch item."""
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph([helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=0)], "row_sum",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch"])],
                              initializer=[axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)], ir_version=ONNX_IR_VERSION)


SIMPLE_INPUTS = 'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, ' \
                '{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'

# model name -> (ONNX model builder, config.pbtxt text or None for no file at all)
CASES = {
    "no_config": (lambda: sum_difference_model(False), None),
    "no_config_fp16_bool": (fp16_bool_model, None),
    "no_config_fixed_shape": (fixed_shape_model, None),
    "no_config_scalar_output": (row_sum_model, None),
    "only_max_batch_size": (lambda: sum_difference_model(False), "max_batch_size: 8\n"),
    "inputs_without_dims": (lambda: sum_difference_model(False),
                            'max_batch_size: 2\n'
                            'input [ { name: "INPUT0" }, { name: "INPUT1" data_type: TYPE_INT32 } ]\n'
                            'output [ { name: "OUTPUT1" } ]\n'),
    "full_rank_means_unbatched": (lambda: sum_difference_model(False),
                                  'input [ { name: "INPUT0" dims: [ -1, 16 ] } ]\n'),
    "wrong_dtype": (lambda: sum_difference_model(False),
                    'max_batch_size: 8\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'),
    "wrong_rank": (lambda: sum_difference_model(False),
                   'max_batch_size: 8\ninput [ { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4, 4 ] } ]\n'),
    "unknown_input": (lambda: sum_difference_model(False),
                      'max_batch_size: 8\ninput [ { name: "INPUT9" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'),
    "batching_a_fixed_shape": (fixed_shape_model, "max_batch_size: 4\n"),
    "complete_but_wrong_output": (lambda: sum_difference_model(False),
                                  "max_batch_size: 8\n" + SIMPLE_INPUTS +
                                  'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'),
    "gpu_instance": (lambda: sum_difference_model(False),
                     "max_batch_size: 8\n" + SIMPLE_INPUTS + "instance_group [ { kind: KIND_GPU } ]\n"),
    "openvino_accelerator": (lambda: sum_difference_model(False),
                             'optimization { execution_accelerators { cpu_execution_accelerator: '
                             '[ { name: "openvino" } ] } }\n'),
    "bad_execution_mode": (lambda: sum_difference_model(False),
                           'parameters { key: "execution_mode" value: { string_value: "7" } }\n'),
}


@pytest.fixture(scope="module")
def auto_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("autocomplete")
    for name, (make_model, config) in CASES.items():
        (repo / name / "1").mkdir(parents=True)
        onnx.save(make_model(), str(repo / name / "1" / "model.onnx"))
        if config is not None:
            (repo / name / "config.pbtxt").write_text(config)
    with ServerProcess([repo], "--exit-on-error=false") as server:
        yield server


def tensors(config: dict, kind: str) -> list[tuple]:
    # proto3 JSON (the gRPC client's as_json) prints int64 dims as strings; HTTP gives numbers.
    return [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config[kind]]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_no_config_at_all_is_filled_from_the_graph(auto_server, protocol):
    config = model_config(auto_server, protocol, "no_config")
    assert config["max_batch_size"] == 4  # Triton's default-max-batch-size: every dim 0 is dynamic
    assert config["platform"] == "onnxruntime_onnx"
    assert tensors(config, "input") == [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    assert tensors(config, "output") == [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]
    assert "dynamic_batching" in config
    a = np.arange(64, dtype=np.int32).reshape(4, 16)
    result = infer(auto_server, protocol, "no_config", {"INPUT0": a, "INPUT1": a})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
    with pytest.raises(InferenceServerException, match="max_batch_size 4"):
        infer(auto_server, protocol, "no_config", {"INPUT0": np.zeros((5, 16), np.int32),
                                                   "INPUT1": np.zeros((5, 16), np.int32)})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_fp16_and_bool_tensors(auto_server, protocol):
    config = model_config(auto_server, protocol, "no_config_fp16_bool")
    assert tensors(config, "input") == [("x", "TYPE_FP16", [-1]), ("flag", "TYPE_BOOL", [3])]
    assert tensors(config, "output") == [("doubled", "TYPE_FP16", [-1]), ("negated", "TYPE_BOOL", [3])]
    x = np.array([[0.5, -1.25, 3.0, 1000.0, 0.0]], dtype=np.float16)
    flag = np.array([[True, False, True]])
    result = infer(auto_server, protocol, "no_config_fp16_bool", {"x": x, "flag": flag})
    assert result.as_numpy("doubled").dtype == np.float16
    np.testing.assert_array_equal(result.as_numpy("doubled"), x + x)
    np.testing.assert_array_equal(result.as_numpy("negated"), ~flag)


def test_fixed_first_dimension_means_no_batching(auto_server):
    config = model_config(auto_server, "http", "no_config_fixed_shape")
    assert config["max_batch_size"] == 0
    assert tensors(config, "input") == [("x", "TYPE_FP32", [2, 3])]
    x = np.array([[-1, 2, -3], [4, -5, 6]], dtype=np.float32)
    np.testing.assert_array_equal(infer(auto_server, "grpc", "no_config_fixed_shape", {"x": x}).as_numpy("y"),
                                  np.maximum(x, 0))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_scalar_per_batch_item_is_served_as_dims_1(auto_server, protocol):
    config = model_config(auto_server, protocol, "no_config_scalar_output")
    assert tensors(config, "output") == [("total", "TYPE_FP32", [1])]
    assert "reshape" in config["output"][0]  # Triton's spelling of "the model itself sees no dims"
    x = np.array([[1, 2, 3], [0.5, -4, 10]], dtype=np.float32)
    total = infer(auto_server, protocol, "no_config_scalar_output", {"x": x}).as_numpy("total")
    np.testing.assert_allclose(total, [[6.0], [6.5]])


def test_only_max_batch_size_given_keeps_it_and_fills_the_rest(auto_server):
    config = model_config(auto_server, "grpc", "only_max_batch_size")
    assert config["max_batch_size"] == 8
    assert tensors(config, "input") == [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    assert [t["name"] for t in config["output"]] == ["OUTPUT0", "OUTPUT1"]


def test_partial_tensors_are_completed_not_replaced(auto_server):
    config = model_config(auto_server, "http", "inputs_without_dims")
    assert config["max_batch_size"] == 2
    assert tensors(config, "input") == [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    # The config listed one output on purpose: clients see that one only.
    assert tensors(config, "output") == [("OUTPUT1", "TYPE_INT32", [16])]
    a = np.full((2, 16), 3, dtype=np.int32)
    result = infer(auto_server, "http", "inputs_without_dims", {"INPUT0": a, "INPUT1": a})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a * 0)
    assert result.as_numpy("OUTPUT0") is None


def test_dims_of_full_rank_keep_max_batch_size_zero(auto_server):
    config = model_config(auto_server, "http", "full_rank_means_unbatched")
    assert config["max_batch_size"] == 0
    assert tensors(config, "input") == [("INPUT0", "TYPE_INT32", [-1, 16]), ("INPUT1", "TYPE_INT32", [-1, 16])]
    a = np.ones((11, 16), dtype=np.int32)  # more rows than any max_batch_size: dim 0 is just a dim here
    result = infer(auto_server, "grpc", "full_rank_means_unbatched", {"INPUT0": a, "INPUT1": a})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


@pytest.mark.parametrize("name, reason", [
    ("wrong_dtype", r"input 'INPUT0' has data_type TYPE_FP32 in config.pbtxt but TYPE_INT32"),
    ("wrong_rank", r"input 'INPUT1' has shape \[-1, 4, 4\] in config.pbtxt.* but \[-1, 16\]"),
    ("unknown_input", r"input 'INPUT9' is not an input of the ONNX model"),
    ("batching_a_fixed_shape", r"input 'x' has no variable first dimension"),
    ("complete_but_wrong_output", r"output 'OUTPUT0' has data_type TYPE_FP32 in config.pbtxt but TYPE_INT32"),
    ("gpu_instance", r"KIND_GPU needs onnxruntime's CUDAExecutionProvider"),
    ("openvino_accelerator", r"openvino accelerator needs onnxruntime's OpenVINOExecutionProvider"),
    ("bad_execution_mode", r"parameter 'execution_mode' must be 0 or 1, got 7"),
])
def test_a_contradicting_config_fails_with_its_reason_and_others_keep_serving(auto_server, name, reason):
    import onnxruntime

    if name == "gpu_instance" and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine has CUDA")
    if name == "openvino_accelerator" and "OpenVINOExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has OpenVINO")
    row = repository_index(auto_server)[name]
    assert row["state"] == "UNAVAILABLE"
    assert row["reason"] and re.search(reason, row["reason"]), row
    with pytest.raises(InferenceServerException):
        model_config(auto_server, "http", name)
    a = np.ones((1, 16), dtype=np.int32)
    np.testing.assert_array_equal(infer(auto_server, "http", "no_config", {"INPUT0": a, "INPUT1": a})
                                  .as_numpy("OUTPUT1"), a * 0)
