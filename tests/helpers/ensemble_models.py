"""Model folders the ensemble tests write: ensembles over `simple`-shaped tensors, a model that fails."""
from __future__ import annotations

from pathlib import Path

SIMPLE_IO = """\
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: {dtype} dims: [ {dim} ] }}, {{ name: "INPUT1" data_type: {dtype} dims: [ {dim} ] }} ]
output [ {{ name: "OUTPUT0" data_type: {dtype} dims: [ {dim} ] }}, {{ name: "OUTPUT1" data_type: {dtype} dims: [ {dim} ] }} ]
"""


def write_ensemble(repo: Path, name: str, steps, dtype: str = "TYPE_INT32", dim: int = 16, extra: str = "") -> None:
    """An ensemble with simple's inputs/outputs; `steps` holds (model, input_map, output_map) triples."""
    def entries(field, mapping):
        return " ".join(f'{field} {{ key: "{k}" value: "{v}" }}' for k, v in mapping.items())

    text = "\n".join(f'  {{ model_name: "{model}" model_version: -1 {entries("input_map", i)} {entries("output_map", o)} }},'
                     for model, i, o in steps).rstrip(",")
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\n{SIMPLE_IO.format(dtype=dtype, dim=dim)}{extra}'
        f"ensemble_scheduling {{ step [\n{text}\n] }}\n")


def fails_for_batch_one_model():
    """OUTPUT0 = INPUT0 for batches of 7, but a batch of 1 cannot be reshaped to [7, -1]: onnxruntime fails."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Constant", [], ["sevens"], value=helper.make_tensor("s", TensorProto.INT64, [2], [7, -1])),
             helper.make_node("Reshape", ["INPUT0", "sevens"], ["grouped"]),
             helper.make_node("Shape", ["INPUT0"], ["shape"]),
             helper.make_node("Reshape", ["grouped", "shape"], ["OUTPUT0"])]
    graph = helper.make_graph(nodes, "fails", [helper.make_tensor_value_info("INPUT0", TensorProto.INT32, ["b", 16])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.INT32, ["b", 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


FAILS_CONFIG = """\
name: "fails"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""
