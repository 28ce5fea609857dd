"""The backend's parts in-process: a session per instance, session options, provider choice,
several requests in one run, and strict configs. The server's model manager drives real loads."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from build_repository import sum_difference_model

from modelplex import (
    InferRequest,
    InferTensor,
    InstanceContext,
    InvalidInput,
    ModelContext,
    RequestedOutput,
    Unsupported,
)
from modelplex.core.settings import ServerConfig
from modelplex.models.config import parse_pbtxt
from modelplex.server.assembly import Server
from modelplex_onnx.instance import OnnxInstance
from modelplex_onnx.session import CPU, CUDA, OPENVINO, TENSORRT, execution_providers, session_options

SIMPLE_CONFIG = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


def write_model(repo: Path, name: str, config: str | None) -> Path:
    (repo / name / "1").mkdir(parents=True)
    onnx.save(sum_difference_model(False), str(repo / name / "1" / "model.onnx"))
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    return repo / name


def with_server(repo: Path, scenario, strict: bool = False):
    """Run `scenario(server)` against a server with no listeners: the manager and data plane only."""
    async def main():
        server = Server(ServerConfig(model_repositories=[repo], strict_model_config=strict, allow_http=False,
                                     allow_grpc=False, allow_metrics=False))
        try:
            return await scenario(server)
        finally:
            await server.manager.stop()

    return asyncio.run(main())


def instance_context(model_dir: Path, config_text: str, kind: str = "CPU", device_id: int = 0) -> InstanceContext:
    config = parse_pbtxt(config_text)
    config.name, config.default_model_filename = model_dir.name, "model.onnx"
    model = ModelContext(model_dir.name, 1, model_dir, model_dir / "1", config,
                         {k: p.string_value for k, p in config.parameters.items()})
    return InstanceContext(model, f"{model_dir.name}_0", 0, kind, device_id)


def simple_request(a: np.ndarray, b: np.ndarray, outputs=()) -> InferRequest:
    return InferRequest("simple", [InferTensor.from_numpy("INPUT0", a), InferTensor.from_numpy("INPUT1", b)],
                        outputs=[RequestedOutput(name) for name in outputs])


def test_instance_group_count_two_creates_two_sessions(tmp_path):
    write_model(tmp_path, "pair", SIMPLE_CONFIG + "instance_group [ { count: 2 kind: KIND_CPU } ]\n")

    async def scenario(server):
        await server.manager.load("pair")
        instances = server.manager.get("pair").instances
        assert len(instances) == 2
        assert instances[0].session is not instances[1].session
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        for instance in instances:
            [response] = await instance.execute([simple_request(a, a)])
            np.testing.assert_array_equal(response.outputs[0].data, a * 2)
        assert len([t for t in threading.enumerate() if t.name.startswith("onnx-pair")]) == 2  # first runs
        await server.manager.unload("pair")
        assert all(instance.session is None for instance in instances)
        assert not [t.name for t in threading.enumerate() if t.name.startswith("onnx-pair")]

    with_server(tmp_path, scenario)


def test_session_options_follow_triton_parameter_names(tmp_path):
    config = SIMPLE_CONFIG + """
optimization { graph { level: 2 } }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "inter_op_thread_count" value: { string_value: "2" } }
parameters { key: "execution_mode" value: { string_value: "1" } }
parameters { key: "enable_mem_pattern" value: { string_value: "false" } }
"""
    instance = OnnxInstance(instance_context(write_model(tmp_path, "tuned", config), config))
    options = instance.session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 2)
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert options.enable_mem_pattern is False


@pytest.mark.parametrize("level, expected", [
    (-1, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC), (1, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
    (2, ort.GraphOptimizationLevel.ORT_DISABLE_ALL), (0, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)])
def test_graph_level_uses_tritons_numbering(level, expected):
    config = parse_pbtxt(f"optimization {{ graph {{ level: {level} }} }}")
    assert session_options(config, {}).graph_optimization_level == expected


@pytest.mark.parametrize("parameters, message", [
    ({"intra_op_thread_count": "two"}, "'intra_op_thread_count' must be an integer"),
    ({"inter_op_thread_count": "-1"}, "'inter_op_thread_count' must be >= 0"),
    ({"enable_mem_arena": "maybe"}, "'enable_mem_arena' must be true or false"),
])
def test_bad_parameters_are_refused_by_name(parameters, message):
    with pytest.raises(InvalidInput, match=message):
        session_options(parse_pbtxt(""), parameters)


@pytest.mark.parametrize("kind, config, available, expected", [
    ("AUTO", "", [CPU], [(CPU, {})]),
    ("AUTO", "", [CUDA, CPU], [(CUDA, {"device_id": "1"}), (CPU, {})]),
    ("CPU", "", [CUDA, CPU], [(CPU, {})]),
    ("GPU", "", [CUDA, CPU], [(CUDA, {"device_id": "1"}), (CPU, {})]),
    ("GPU", 'optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" '
            'parameters { key: "precision_mode" value: "FP16" } } ] } }',
     [TENSORRT, CUDA, CPU],
     [(TENSORRT, {"device_id": "1", "precision_mode": "FP16"}), (CUDA, {"device_id": "1"}), (CPU, {})]),
    ("GPU", 'optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "cuda" '
            'parameters { key: "cudnn_conv_use_max_workspace" value: "0" } } ] } }', [CUDA, CPU],
     [(CUDA, {"device_id": "1", "cudnn_conv_use_max_workspace": "0"}), (CPU, {})]),
    ("AUTO", 'parameters { key: "execution_provider" value: { string_value: "tensorrt" } }', [TENSORRT, CUDA, CPU],
     [(TENSORRT, {"device_id": "1"}), (CUDA, {"device_id": "1"}), (CPU, {})]),
    ("AUTO", 'parameters { key: "execution_provider" value: { string_value: "openvino" } }', [OPENVINO, CPU],
     [(OPENVINO, {"device_type": "CPU"}), (CPU, {})]),
    ("AUTO", 'parameters { key: "execution_provider" value: { string_value: "cpu" } }', [CUDA, CPU], [(CPU, {})]),
    ("CPU", 'optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" '
            'parameters { key: "device_type" value: "GPU" } } ] } }', [OPENVINO, CPU],
     [(OPENVINO, {"device_type": "GPU"}), (CPU, {})]),
])
def test_execution_providers_for_kind_parameters_and_accelerators(tmp_path, kind, config, available, expected):
    ictx = instance_context(tmp_path / "m", config, kind=kind, device_id=1)
    assert execution_providers(ictx, available) == expected


@pytest.mark.parametrize("kind, config, message", [
    ("GPU", "", "KIND_GPU needs onnxruntime's CUDAExecutionProvider, which this onnxruntime build lacks"),
    ("AUTO", 'parameters { key: "execution_provider" value: { string_value: "cuda" } }',
     "execution_provider 'cuda' needs onnxruntime's CUDAExecutionProvider"),
    ("AUTO", 'parameters { key: "execution_provider" value: { string_value: "openvino" } }',
     "openvino accelerator needs onnxruntime's OpenVINOExecutionProvider"),
])
def test_a_missing_provider_is_named(tmp_path, kind, config, message):
    ictx = instance_context(tmp_path / "m", config, kind=kind)
    with pytest.raises(Unsupported, match=message):
        execution_providers(ictx, [CPU])


def test_unknown_provider_names_are_refused(tmp_path):
    ictx = instance_context(tmp_path / "m", 'parameters { key: "execution_provider" value: { string_value: "npu" } }')
    with pytest.raises(InvalidInput, match="'execution_provider' must be one of cpu, cuda, openvino, tensorrt"):
        execution_providers(ictx, [CPU])
    ictx = instance_context(tmp_path / "m", 'optimization { execution_accelerators { cpu_execution_accelerator: '
                                            '[ { name: "dnnl" } ] } }')
    with pytest.raises(InvalidInput, match="unknown cpu_execution_accelerator 'dnnl'"):
        execution_providers(ictx, [CPU])


def test_several_requests_run_as_one_batch_and_split_back(tmp_path):
    instance = OnnxInstance(instance_context(write_model(tmp_path, "simple", SIMPLE_CONFIG), SIMPLE_CONFIG))
    rng = np.random.default_rng(0)
    batches = [rng.integers(-50, 50, (n, 16), dtype=np.int32) for n in (1, 3, 2)]
    requests = [simple_request(batches[0], batches[0] + 1),
                simple_request(batches[1], batches[1] * 2, outputs=["OUTPUT1"]),
                simple_request(batches[2], batches[2], outputs=["OUTPUT0"])]
    responses = asyncio.run(instance.execute(requests))
    assert [[t.name for t in r.outputs] for r in responses] == [["OUTPUT0", "OUTPUT1"], ["OUTPUT1"], ["OUTPUT0"]]
    np.testing.assert_array_equal(responses[0].outputs[0].data, batches[0] * 2 + 1)
    np.testing.assert_array_equal(responses[0].outputs[1].data, -np.ones((1, 16), np.int32))
    np.testing.assert_array_equal(responses[1].outputs[0].data, -batches[1])
    np.testing.assert_array_equal(responses[2].outputs[0].data, batches[2] * 2)
    assert [r.outputs[0].shape for r in responses] == [[1, 16], [3, 16], [2, 16]]


def test_strict_model_config_without_config_names_the_missing_inputs(tmp_path):
    write_model(tmp_path, "bare", None)

    async def scenario(server):
        with pytest.raises(InvalidInput, match="input\\(s\\) 'INPUT0', 'INPUT1' are missing from config.pbtxt"):
            await server.manager.load("bare")

    with_server(tmp_path, scenario, strict=True)


def slow_model():
    """Ten chained 512x512 MatMuls on [batch, 512]: milliseconds per run, far above the inline limit."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.eye(512, dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", "w"], [f"h{i + 1}"]) for i in range(10)]
    nodes.append(helper.make_node("Identity", ["h10"], ["y"]))
    graph = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 512])],
                              initializer=[weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_slow_model_never_blocks_the_event_loop(tmp_path):
    (tmp_path / "slow" / "1").mkdir(parents=True)
    onnx.save(slow_model(), str(tmp_path / "slow" / "1" / "model.onnx"))
    config = 'max_batch_size: 64\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 512 ] } ]\n' \
             'output [ { name: "y" data_type: TYPE_FP32 dims: [ 512 ] } ]\n'
    instance = OnnxInstance(instance_context(tmp_path / "slow", config))
    x = np.random.default_rng(0).standard_normal((64, 512), dtype=np.float32)

    async def scenario():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        task = asyncio.create_task(ticker())
        counts = []
        for _ in range(6):
            before = ticks
            [response] = await instance.execute([InferRequest("slow", [InferTensor.from_numpy("x", x)])])
            counts.append(ticks - before)
            np.testing.assert_allclose(response.outputs[0].data, x, rtol=1e-5)
        task.cancel()
        await instance.close()
        return counts

    # Every run, including the later ones, left the loop free to tick while it ran on the thread.
    assert all(count > 0 for count in asyncio.run(scenario()))
