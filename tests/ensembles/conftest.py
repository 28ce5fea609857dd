"""Fixtures of the ensemble tests: a repository with `ensemble_add_sub`, broken ensembles and a failing model."""
from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def ensemble_repo(tmp_path_factory) -> Path:
    import onnx
    from build_repository import build

    repo = tmp_path_factory.mktemp("ensemble_repo")
    build(repo, ["simple", "simple_string", "ensemble_add_sub"])
    (repo / "fails" / "1").mkdir(parents=True)
    onnx.save(fails_for_batch_one_model(), str(repo / "fails" / "1" / "model.onnx"))
    (repo / "fails" / "config.pbtxt").write_text(FAILS_CONFIG)
    both = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
    outputs = {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"}
    write_ensemble(repo, "ensemble_fails", [
        ("simple", both, {"OUTPUT0": "SUM", "OUTPUT1": "OUTPUT1"}),
        ("fails", {"INPUT0": "SUM"}, {"OUTPUT0": "OUTPUT0"})])
    # Broken ensembles, one per check the load makes.
    write_ensemble(repo, "bad_cycle", [
        ("simple", {"INPUT0": "INPUT0", "INPUT1": "B"}, {"OUTPUT0": "A", "OUTPUT1": "OUTPUT0"}),
        ("simple", {"INPUT0": "A", "INPUT1": "INPUT1"}, {"OUTPUT0": "B", "OUTPUT1": "OUTPUT1"})])
    write_ensemble(repo, "bad_unproduced", [("simple", {"INPUT0": "INPUT0", "INPUT1": "NOWHERE"}, outputs)])
    write_ensemble(repo, "bad_no_output", [("simple", both, {"OUTPUT0": "OUTPUT0"})])
    write_ensemble(repo, "bad_dtype", [
        ("simple", both, {"OUTPUT0": "SUM", "OUTPUT1": "OUTPUT1"}),
        ("simple_string", {"INPUT0": "SUM", "INPUT1": "SUM"}, {"OUTPUT0": "OUTPUT0"})])
    write_ensemble(repo, "bad_shape", [("simple", both, outputs)], dim=8)
    write_ensemble(repo, "bad_missing_model", [("simple", both, {"OUTPUT0": "OUTPUT0"}),
                                               ("no_such_model", both, {"OUTPUT1": "OUTPUT1"})])
    write_ensemble(repo, "bad_unknown_input", [("simple", {"INPUT0": "INPUT0", "INPUT1": "INPUT1", "INPUT9": "INPUT1"},
                                                outputs)])
    write_ensemble(repo, "bad_self", [("simple", both, {"OUTPUT0": "OUTPUT0"}), ("bad_self", both, {"OUTPUT1": "OUTPUT1"})])
    return repo
