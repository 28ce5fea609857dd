"""A real server over tiny OpenVINO models: auto-completed configs, ONNX read by OpenVINO, Triton's
parameter names, device choice (the AUTO fallback), and models that must fail to load with the reason
in the repository index while every other model keeps serving."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers.infer_clients import PROTOCOLS, client, infer, model_config, repository_index
from helpers.ov_models import expected_linear, linear_onnx, openvino_config, write_ir
from helpers.serverproc import ServerProcess

GOOD = {
    "linear": None,  # no config.pbtxt at all: model.xml says OpenVINO, the model says the rest
    "auto_fallback": openvino_config(device="AUTO:GPU,CPU", INFERENCE_PRECISION_HINT="f32"),
    "auto_plain": openvino_config(device="AUTO"),
    "triton_parameters": openvino_config(TARGET_DEVICE="cpu", PERFORMANCE_HINT="throughput", NUM_STREAMS="2",
                                         INFERENCE_NUM_THREADS="2", RESHAPE_IO_LAYERS="YES"),
    "cached": openvino_config(cache_dir="ov_cache", INFERENCE_PRECISION_HINT="fp32"),
}
# OpenVINO's CPU default precision is bf16 where the CPU has it (3 significant digits).
IN_F32 = ("auto_fallback", "cached")
# model -> (config, words the load error must contain)
BAD = {
    "on_gpu": (openvino_config(device="GPU"), ["device 'GPU' is not available", "available OpenVINO devices: CPU"]),
    "on_npu": (openvino_config(device="NPU"), ["device 'NPU' is not available", "CPU"]),
    "hetero_gpu": (openvino_config(device="HETERO:GPU,CPU"), ["device 'GPU' is not available", "CPU"]),
    "auto_without_any": (openvino_config(device="AUTO:GPU,NPU"), ["device 'GPU' is not available"]),
    "kind_gpu": ('backend: "openvino"\ninstance_group [ { kind: KIND_GPU } ]\n', ["device 'GPU' is not available"]),
    "kind_cpu_device_gpu": ('backend: "openvino"\ninstance_group [ { kind: KIND_CPU } ]\n'
                            'parameters { key: "device" value { string_value: "GPU" } }\n',
                            ["KIND_CPU contradicts parameter device 'GPU'"]),
    "precision_i8": (openvino_config(INFERENCE_PRECISION_HINT="i8"), ["INFERENCE_PRECISION_HINT", "f32, bf16, f16", "'i8'"]),
    "bad_hint": (openvino_config(PERFORMANCE_HINT="FASTEST"), ["PERFORMANCE_HINT", "LATENCY, THROUGHPUT"]),
    "bad_streams": (openvino_config(NUM_STREAMS="many"), ["NUM_STREAMS", "'many'"]),
    "no_bin": (openvino_config(), ["model.bin is missing next to model.xml"]),
    "garbage_xml": (openvino_config(), ["OpenVINO cannot read model.xml"]),
    # A partial config is completed from the IR (auto-complete), a full one is checked by the instance:
    # both by the host's rules, and both name the model's format as OpenVINO.
    "wrong_type": (openvino_config() + 'input [ { name: "x" data_type: TYPE_INT32 dims: [ 4 ] } ]\n',
                   ["input 'x' has data_type TYPE_INT32 in config.pbtxt but TYPE_FP32 in the OpenVINO model"]),
    "unknown_input": (openvino_config() + 'max_batch_size: 4\ninput [ { name: "z" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                      'output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n',
                      ["input 'z' is not an input of the OpenVINO model (its inputs: x)"]),
}


def _cpu_capabilities() -> list[str]:
    from modelplex_openvino.devices import shared_core

    return [str(c) for c in shared_core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("openvino_repo")
    for name, config in GOOD.items():
        write_ir(repo, name, config)
    for name, (config, _) in BAD.items():
        write_ir(repo, name, config)
    write_ir(repo, "precision_f16", openvino_config(INFERENCE_PRECISION_HINT="f16"))
    write_ir(repo, "hint_bf16", openvino_config(HINT_BF16="YES"))  # Triton's spelling of bf16
    (repo / "no_bin" / "1" / "model.bin").unlink()
    (repo / "garbage_xml" / "1" / "model.xml").write_text("<net><layers>")
    write_text_models(repo)
    (repo / "linear_onnx" / "1").mkdir(parents=True)
    (repo / "linear_onnx" / "config.pbtxt").write_text(openvino_config())
    linear_onnx(repo / "linear_onnx" / "1" / "model.onnx")
    return repo


def write_text_models(repo: Path) -> None:
    """minilm's tokenizer and detokenizer as OpenVINO models (openvino_tokenizers): BYTES in, BYTES out."""
    from build_repository import minilm_source
    from openvino_tokenizers import convert_tokenizer
    from transformers import AutoTokenizer

    tokenizer, detokenizer = convert_tokenizer(AutoTokenizer.from_pretrained(minilm_source()), with_detokenizer=True)
    write_ir(repo, "tokenizer", None, tokenizer)
    write_ir(repo, "detokenizer", None, detokenizer)


@pytest.fixture(scope="module")
def server(repo):
    with ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", "*", "--exit-on-error=false") as server:
        yield server


X = np.array([[1, -2, 3, 0.5], [0, 1, 0, 1]], np.float32)


@pytest.mark.parametrize("model", [*GOOD, "linear_onnx"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_good_models_serve(server, model, protocol):
    y = infer(server, protocol, model, {"x": X}).as_numpy("y")
    np.testing.assert_allclose(y, expected_linear(X), rtol=1e-6 if model in IN_F32 else 1e-2)


@pytest.mark.parametrize("model", BAD)
def test_bad_models_fail_with_the_reason(server, model):
    row = repository_index(server)[model]
    assert row["state"] == "UNAVAILABLE"
    for words in BAD[model][1]:
        assert words in row["reason"], row["reason"]
    assert not client(server, "http").is_model_ready(model)


@pytest.mark.parametrize("model, precision", [("precision_f16", "f16"), ("hint_bf16", "bf16")])
def test_half_precisions_only_where_the_cpu_computes_in_them(server, model, precision):
    row = repository_index(server)[model]
    if precision.upper() in _cpu_capabilities():
        assert row["state"] == "READY"
        np.testing.assert_allclose(infer(server, "grpc", model, {"x": X}).as_numpy("y"), expected_linear(X), rtol=1e-2)
    else:  # OpenVINO would silently run another precision instead (f16 as bf16, bf16 as f32)
        assert row["state"] == "UNAVAILABLE" and f"cannot infer in {precision}" in row["reason"], row["reason"]


def test_auto_complete_from_the_ir_and_from_onnx(server):
    for model in ("linear", "linear_onnx"):
        config = model_config(server, "http", model)
        assert config["backend"] == "openvino" and config["max_batch_size"] == 4  # every dim 0 is dynamic
        assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("x", "TYPE_FP32", [4])]
        assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [("y", "TYPE_FP32", [3])]
    assert model_config(server, "http", "linear")["default_model_filename"] == "model.xml"


def test_cache_dir_holds_the_compiled_model(server, repo):
    assert list((repo / "cached" / "ov_cache").glob("*.blob")), "no compiled blob in cache_dir"
    assert not (repo / "linear" / "ov_cache").exists()


def test_devices_endpoint_lists_openvinos_devices(server):
    import httpx

    from modelplex_openvino.devices import shared_core

    answer = httpx.get(f"http://{server.http_url}/v2/devices").json()
    core = shared_core()
    assert [d["name"] for d in answer["devices"]] == core.available_devices
    cpu = next(d for d in answer["devices"] if d["name"] == "CPU")
    assert cpu["full_device_name"] == core.get_property("CPU", "FULL_DEVICE_NAME")
    assert cpu["optimization_capabilities"] == _cpu_capabilities() and "FP32" in cpu["optimization_capabilities"]
    assert answer["openvino_version"]


def test_a_reload_of_a_broken_model_leaves_the_others_serving(server, repo):
    http = client(server, "http")
    with pytest.raises(Exception, match="device 'GPU' is not available"):
        http.load_model("on_gpu")
    np.testing.assert_allclose(infer(server, "grpc", "cached", {"x": X}).as_numpy("y"), expected_linear(X), rtol=1e-6)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_text_in_and_out(server, protocol):
    """BYTES tensors to and from OpenVINO string tensors: text -> token ids -> the same text."""
    from build_repository import minilm_source
    from transformers import AutoTokenizer

    texts = ["hello world", "a tokenizer served by openvino"]  # no punctuation: the detokenizer spaces it
    tokenizer_config = model_config(server, "http", "tokenizer")
    assert tokenizer_config["input"][0]["data_type"] == "TYPE_STRING"
    text_input = tokenizer_config["input"][0]["name"]
    result = infer(server, protocol, "tokenizer", {text_input: np.array([[t.encode()] for t in texts], np.object_)})
    expected = AutoTokenizer.from_pretrained(minilm_source())(texts, padding=True, return_tensors="np")
    np.testing.assert_array_equal(result.as_numpy("input_ids"), expected["input_ids"])
    detokenizer = model_config(server, "http", "detokenizer")
    ids_input, text_output = detokenizer["input"][0]["name"], detokenizer["output"][0]["name"]
    result = infer(server, protocol, "detokenizer", {ids_input: expected["input_ids"].astype(np.int64)})
    assert [row[0] for row in result.as_numpy(text_output).tolist()] == [t.encode() for t in texts]
