"""Helpers of the OpenVINO backend tests: tiny models written from code, in-process instance contexts,
minilm's tokenizer and its torch reference."""
from __future__ import annotations

from pathlib import Path

import numpy as np

WEIGHTS = np.arange(12, dtype=np.float32).reshape(4, 3) / 10


def linear_model(batch: int = -1, features: int = 4):
    """`y = relu(x @ WEIGHTS)` on x `[batch, 4]` f32 (-1: dynamic), as an `openvino.Model`."""
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([batch, features], ov.Type.f32, name="x")
    y = ops.relu(ops.matmul(x, ops.constant(WEIGHTS), False, False))
    y.output(0).get_tensor().set_names({"y"})
    return ov.Model([y], [x], "linear")


def expected_linear(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ WEIGHTS, 0)


def write_ir(repo: Path, name: str, config: str | None, model=None) -> Path:
    """`repo/name/1/model.xml` + `model.bin` (fp32 weights) and the config.pbtxt when given."""
    import openvino as ov

    (repo / name / "1").mkdir(parents=True)
    ov.save_model(model if model is not None else linear_model(), repo / name / "1" / "model.xml",
                  compress_to_fp16=False)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    return repo / name


def instance_context(model_dir: Path, config_text: str, kind: str = "CPU", device_id: int = 0):
    """What the model manager hands `create_instance` for instance 0 of `model_dir`'s version 1."""
    from modelplex import InstanceContext, ModelContext
    from modelplex.models.config import parse_pbtxt

    config = parse_pbtxt(config_text)
    config.name = model_dir.name
    config.default_model_filename = config.default_model_filename or "model.xml"
    model = ModelContext(model_dir.name, 1, model_dir, model_dir / "1", config,
                         {k: p.string_value for k, p in config.parameters.items()})
    return InstanceContext(model, f"{model_dir.name}_0", 0, kind, device_id)


def tokenize(repo: Path, texts: list[str]) -> dict[str, np.ndarray]:
    """`texts` through the tokenizer saved next to minilm_ov (padded to the longest), as INT64 inputs."""
    from transformers import AutoTokenizer

    encoded = AutoTokenizer.from_pretrained(repo / "minilm_ov" / "1" / "tokenizer")(texts, padding=True,
                                                                                      return_tensors="np")
    return {name: encoded[name].astype(np.int64) for name in ("input_ids", "attention_mask")}


def torch_embeddings(inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(token states, sentence embeddings): transformers' AutoModel + mean pooling + L2 norm."""
    import torch
    from build_repository import minilm_source
    from transformers import AutoModel

    model = AutoModel.from_pretrained(minilm_source()).eval()
    ids, mask = torch.from_numpy(inputs["input_ids"]), torch.from_numpy(inputs["attention_mask"])
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = mask.unsqueeze(-1).float()
    pooled = torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), p=2.0, dim=1)
    return hidden.numpy(), pooled.numpy()


def linear_onnx(path: Path) -> None:
    """The same `y = relu(x @ WEIGHTS)` as an ONNX file (for OpenVINO's ONNX frontend)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Relu", ["xw"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(WEIGHTS, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def openvino_config(**parameters: str) -> str:
    """A config.pbtxt naming only the backend and the given parameters (auto-complete does the rest)."""
    return 'backend: "openvino"\n' + "".join(
        f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n' for key, value in parameters.items())
