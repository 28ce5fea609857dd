"""The backend's parts in-process: the infer-request pool under concurrency, the compiled-model cache,
device selection rules, and static shapes for NPU."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from helpers.ov_models import expected_linear, instance_context, linear_model, linear_onnx, write_ir

from modelplex import InferRequest, InferTensor, InvalidInput, RequestedOutput
from modelplex.models.config import parse_pbtxt
from modelplex.scheduling.batch_merge import merge_requests, split_response
from modelplex_openvino.devices import configured_device, select_device
from modelplex_openvino.instance import OpenVINOInstance
from modelplex_openvino.static_shapes import make_static, needs_static_shapes

LINEAR_CONFIG = """
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
parameters { key: "INFERENCE_PRECISION_HINT" value { string_value: "f32" } }
"""


def slow_model(width: int = 256, depth: int = 24):
    """`depth` tanh(x @ W) layers on [batch, width]: a few ms per run, long enough to overlap runs."""
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([-1, width], ov.Type.f32, name="x")
    h = x
    weights = (np.random.default_rng(0).standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    for _ in range(depth):
        h = ops.tanh(ops.matmul(h, ops.constant(weights), False, False))
    h.output(0).get_tensor().set_names({"y"})
    return ov.Model([h], [x], "slow")


def request(x: np.ndarray) -> InferRequest:
    return InferRequest("m", [InferTensor.from_numpy("x", x)])


class OverlapCounter:
    """Wraps the pool's real infer requests to count how many of them are inside `infer` at once."""

    def __init__(self):
        self.lock, self.running, self.max_running, self.num_runs = threading.Lock(), 0, 0, 0

    def wrap(self, infer_request):
        counter = self

        class Counted:
            def infer(self, *args, **kwargs):
                with counter.lock:
                    counter.running += 1
                    counter.num_runs += 1
                    counter.max_running = max(counter.max_running, counter.running)
                try:
                    return infer_request.infer(*args, **kwargs)
                finally:
                    with counter.lock:
                        counter.running -= 1

            def get_output_tensor(self, index):
                return infer_request.get_output_tensor(index)

        return Counted()


def test_concurrent_requests_run_on_every_infer_request(tmp_path):
    """Two streams give two infer requests; eight requests at once run two at a time in OpenVINO, and
    each request still gets its own answer."""
    config = LINEAR_CONFIG.replace("dims: [ 4 ]", "dims: [ 256 ]").replace("dims: [ 3 ]", "dims: [ 256 ]") + \
        'parameters { key: "NUM_STREAMS" value { string_value: "2" } }\n'
    instance = OpenVINOInstance(instance_context(write_ir(tmp_path, "slow", None, slow_model()), config))
    assert instance.num_requests == 2 == int(instance.compiled_model.get_property("NUM_STREAMS"))
    counter = OverlapCounter()
    for infer_request in [instance._idle.get_nowait() for _ in range(instance.num_requests)]:
        instance._idle.put_nowait(counter.wrap(infer_request))
    inputs = [np.full((16, 256), i / 10, np.float32) for i in range(8)]

    async def main():
        alone = [(await instance.execute([request(x)]))[0].outputs[0].data for x in inputs]
        together = await asyncio.gather(*(instance.execute([request(x)]) for x in inputs))
        await instance.close()
        return alone, [r[0].outputs[0].data for r in together]

    alone, together = asyncio.run(main())
    assert counter.max_running == 2, "the two infer requests never ran at the same time"
    for i, (a, t) in enumerate(zip(alone, together)):
        np.testing.assert_array_equal(t, a, err_msg=f"request {i}")
    assert len({float(a[0, 0]) for a in alone}) == len(inputs)  # every input has its own answer


def test_a_batch_of_requests_is_one_run(tmp_path):
    """A dynamic batch the host merged runs once, and each request gets its own rows and outputs."""
    config = LINEAR_CONFIG + 'parameters { key: "PERFORMANCE_HINT" value { string_value: "LATENCY" } }\n'
    instance = OpenVINOInstance(instance_context(write_ir(tmp_path, "linear", None), config))
    assert instance.num_requests == 1 == instance.max_concurrency
    counter = OverlapCounter()
    instance._idle.put_nowait(counter.wrap(instance._idle.get_nowait()))
    x = np.arange(16, dtype=np.float32).reshape(4, 4) - 6
    batch = [request(x[:1]), request(x[1:3]), request(x[3:])]
    batch[1].outputs = [RequestedOutput("y")]
    responses = split_response(asyncio.run(instance.execute([merge_requests(batch)]))[0], batch)
    assert counter.num_runs == 1
    for response, rows in zip(responses, (x[:1], x[1:3], x[3:])):
        assert [t.name for t in response.outputs] == ["y"] and response.outputs[0].shape == [len(rows), 3]
        np.testing.assert_allclose(response.outputs[0].data, expected_linear(rows), rtol=1e-6)


def test_the_second_load_comes_from_cache_dir(tmp_path):
    model_dir = write_ir(tmp_path, "cached", None)
    config = LINEAR_CONFIG + 'parameters { key: "cache_dir" value { string_value: "ov_cache" } }\n'
    first = OpenVINOInstance(instance_context(model_dir, config))
    assert not first.loaded_from_cache and list((model_dir / "ov_cache").iterdir())
    second = OpenVINOInstance(instance_context(model_dir, config))
    assert second.loaded_from_cache
    x = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(asyncio.run(second.execute([request(x)]))[0].outputs[0].data, expected_linear(x),
                               rtol=1e-6)


@pytest.mark.parametrize("kind, device_id, parameters, expected", [
    ("AUTO", 0, {}, "CPU"),  # Triton's default TARGET_DEVICE
    ("CPU", 0, {}, "CPU"),
    ("GPU", 0, {}, "GPU"),
    ("GPU", 1, {}, "GPU.1"),
    ("GPU", 0, {"device": "hetero:gpu,cpu"}, "HETERO:GPU,CPU"),
    ("AUTO", 0, {"TARGET_DEVICE": "npu"}, "NPU"),
    ("CPU", 0, {"device": "AUTO"}, "AUTO"),
    ("AUTO", 0, {"device": "GPU", "TARGET_DEVICE": "GPU"}, "GPU"),
])
def test_configured_device(tmp_path, kind, device_id, parameters, expected):
    ictx = instance_context(tmp_path / "m", LINEAR_CONFIG, kind, device_id)
    ictx.model.parameters.update(parameters)
    assert configured_device(ictx) == expected


@pytest.mark.parametrize("kind, parameters, words", [
    ("GPU", {"device": "NPU"}, "KIND_GPU contradicts parameter device 'NPU'"),
    ("CPU", {"device": "HETERO:GPU,NPU"}, "KIND_CPU contradicts"),
    ("AUTO", {"device": "GPU", "TARGET_DEVICE": "CPU"}, "disagree"),
])
def test_configured_device_refuses_contradictions(tmp_path, kind, parameters, words):
    ictx = instance_context(tmp_path / "m", LINEAR_CONFIG, kind)
    ictx.model.parameters.update(parameters)
    with pytest.raises(InvalidInput, match=words):
        configured_device(ictx)


@pytest.mark.parametrize("device, available, expected", [
    ("CPU", ["CPU"], "CPU"),
    ("AUTO", ["CPU"], "AUTO"),
    ("AUTO:GPU,CPU", ["CPU"], "AUTO:CPU"),  # the fallback: AUTO keeps the candidates present
    ("AUTO:GPU,CPU", ["CPU", "GPU"], "AUTO:GPU,CPU"),
    ("GPU.0", ["CPU", "GPU"], "GPU.0"),  # a lone GPU is listed as plain GPU
    ("GPU.1", ["CPU", "GPU.0", "GPU.1"], "GPU.1"),
    ("HETERO:GPU,CPU", ["CPU", "GPU.0", "GPU.1"], "HETERO:GPU,CPU"),
])
def test_select_device(device, available, expected):
    assert select_device(device, available, "m") == expected


@pytest.mark.parametrize("device, available, words", [
    ("GPU", ["CPU"], "device 'GPU' is not available; available OpenVINO devices: CPU"),
    ("GPU.1", ["CPU", "GPU"], "device 'GPU.1' is not available; available OpenVINO devices: CPU, GPU"),
    ("HETERO:GPU,CPU", ["CPU"], "device 'GPU' is not available"),
    ("AUTO:GPU,NPU", ["CPU"], "device 'GPU' is not available"),
    ("HETERO", ["CPU"], "needs a list of devices"),
])
def test_select_device_names_the_devices_present(device, available, words):
    with pytest.raises(InvalidInput, match=words):
        select_device(device, available, "m")


def test_npu_reshapes_to_the_configs_static_dims():
    assert needs_static_shapes("NPU") and needs_static_shapes("HETERO:NPU,CPU") and not needs_static_shapes("CPU")
    model, config = linear_model(), parse_pbtxt(LINEAR_CONFIG)
    config.name = "linear"
    make_static(model, config, "device NPU")
    assert [list(p.get_shape()) for p in model.inputs] == [[8, 4]]  # batch = max_batch_size
    assert [list(p.get_shape()) for p in model.outputs] == [[8, 3]]


def test_npu_says_which_input_cannot_be_static():
    config = parse_pbtxt(LINEAR_CONFIG.replace("dims: [ 4 ]", "dims: [ -1 ]"))
    config.name = "linear"
    with pytest.raises(InvalidInput, match=r"device NPU needs static shapes, but input 'x' has dims \[-1\]"):
        make_static(linear_model(), config, "device NPU")


def test_npu_says_when_the_graph_refuses_the_static_shape():
    config = parse_pbtxt(LINEAR_CONFIG.replace("dims: [ 4 ]", "dims: [ 5 ]"))  # the weights need 4
    config.name = "linear"
    with pytest.raises(InvalidInput, match=r"the model cannot be reshaped to \{'x': \[8, 5\]\}"):
        make_static(linear_model(), config, "device NPU")


FIRST_RUNS_AT_ONCE = """
import sys, threading
from pathlib import Path
import numpy as np
from helpers.ov_models import instance_context
from modelplex_openvino.instance import OpenVINOInstance
instance = OpenVINOInstance(instance_context(Path({model_dir!r}), {config!r}))
requests = [instance.compiled_model.create_infer_request() for _ in range(4)]
start = threading.Barrier(len(requests))
def first_run(infer_request):
    start.wait()  # the runs' first steps as close together as threads allow
    infer_request.infer({{0: np.ones((2, 4), np.float32)}}, share_inputs=True)
threads = [threading.Thread(target=first_run, args=(r,)) for r in requests]
[t.start() for t in threads]
[t.join() for t in threads]
print("done")
"""


def test_the_first_runs_may_come_at_once(tmp_path):
    """The very first runs of a process on several infer requests at once (as the pool's threads may make
    them): without `shared_core` making pyopenvino's first `to_dtype()` alone, most fresh processes deadlock."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    model_dir = write_ir(tmp_path, "linear", None)
    config = LINEAR_CONFIG + 'parameters { key: "NUM_STREAMS" value { string_value: "2" } }\n'
    script = FIRST_RUNS_AT_ONCE.format(model_dir=str(model_dir), config=config)
    tests = str(Path(__file__).parent.parent)  # the children import helpers.ov_models from there
    runs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env={**os.environ, "PYTHONPATH": tests}) for _ in range(2)]
    try:
        outputs = [run.communicate(timeout=60)[0] for run in runs]
    finally:
        for run in runs:
            run.kill()
    assert all(output.strip().endswith("done") for output in outputs), outputs


def test_an_onnx_file_needs_no_default_model_filename(tmp_path):
    """`backend: "openvino"` with only model.onnx in the version folder: OpenVINO reads the ONNX file."""
    (tmp_path / "linear_onnx" / "1").mkdir(parents=True)
    linear_onnx(tmp_path / "linear_onnx" / "1" / "model.onnx")
    instance = OpenVINOInstance(instance_context(tmp_path / "linear_onnx", LINEAR_CONFIG))
    x = np.ones((3, 4), np.float32)
    np.testing.assert_allclose(asyncio.run(instance.execute([request(x)]))[0].outputs[0].data, expected_linear(x),
                               rtol=1e-6)


def test_models_config_pbtxt_cannot_describe_are_refused(tmp_path):
    import openvino as ov
    import openvino.opset13 as ops

    from modelplex_openvino.autocomplete import auto_complete_config

    any_rank = ops.parameter(ov.PartialShape.dynamic(), ov.Type.f32, name="x")
    bf16 = ops.parameter([-1, 4], ov.Type.bf16, name="x")
    for name, model, words in [
            ("any_rank", ov.Model([ops.relu(any_rank)], [any_rank]), "model 'any_rank': tensor 'x' has a dynamic rank"),
            ("bf16", ov.Model([ops.relu(bf16)], [bf16]), "which modelplex cannot serve")]:
        ictx = instance_context(write_ir(tmp_path, name, None, model), 'backend: "openvino"')
        with pytest.raises(InvalidInput, match=words):
            auto_complete_config(ictx.model)
