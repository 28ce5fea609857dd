"""The stateful examples behind NVIDIA's sequence client examples (`simple_*_sequence_*_client.py`).

`simple_sequence` is Triton's own: its config verbatim and an ONNX graph computing what Triton's
`simple_sequence/1/model.onnx` answers, OUTPUT = (INPUT + START) * READY. `simple_dyna_sequence`
(CORRID TYPE_UINT64) and `simple_string_dyna_sequence` (TYPE_STRING) are Triton's `dyna_sequence`
backend as a Python model: an accumulator per correlation ID that START sets, each request adds to,
and END adds the ID to. `simple_sequence_state` keeps its running sum in an implicit state.
"""
from __future__ import annotations

import shutil
from pathlib import Path

PYTHON_MODELS = Path(__file__).resolve().parent / "python_models"

def _bool_control(name: str, kind: str) -> str:
    return f'    {{ name: "{name}" control [ {{ kind: {kind} int32_false_true: [ 0, 1 ] }} ] }}'


def _controls(end: bool = False, corrid_type: str | None = None) -> str:
    lines = [_bool_control("START", "CONTROL_SEQUENCE_START")]
    if end:
        lines.append(_bool_control("END", "CONTROL_SEQUENCE_END"))
    lines.append(_bool_control("READY", "CONTROL_SEQUENCE_READY"))
    if corrid_type:
        corrid = f"{{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }}"
        lines.append(f'    {{ name: "CORRID" control [ {corrid} ] }}')
    return "  control_input [\n" + ",\n".join(lines) + "\n  ]\n"


_IO = """\
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

SIMPLE_SEQUENCE_CONFIG = ('name: "simple_sequence"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                          "sequence_batching {\n" + _controls() + "}\n" + _IO
                          + "instance_group [ { kind: KIND_CPU } ]\n")


def dyna_config(name: str, corrid_type: str) -> str:
    """Triton's simple_dyna_sequence config (oldest-first batching over 1024 candidate sequences, two
    instances), on the Python backend."""
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\nsequence_batching {{\n'
            "  max_sequence_idle_microseconds: 10000000\n"
            "  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }\n"
            + _controls(end=True, corrid_type=corrid_type) + "}\n" + _IO
            + "instance_group [ { count: 2 kind: KIND_CPU } ]\n")


SEQUENCE_STATE_CONFIG = """\
name: "simple_sequence_state"
backend: "python"
max_batch_size: 8
sequence_batching {
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ 1 ]
      initial_state: { name: "zeros" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }
    }
  ]
}
""" + _IO + "instance_group [ { kind: KIND_CPU } ]\n"


def sequence_model():
    """OUTPUT = (INPUT + START) * READY on [batch, 1] INT32: the answers NVIDIA's clients expect."""
    import onnx
    from build_repository import ONNX_IR_VERSION, ONNX_OPSET
    from onnx import TensorProto, helper

    def tensor(name):
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 1])

    nodes = [helper.make_node("Add", ["INPUT", "START"], ["sum"]),
             helper.make_node("Mul", ["sum", "READY"], ["OUTPUT"])]
    graph = helper.make_graph(nodes, "simple_sequence", [tensor("INPUT"), tensor("START"), tensor("READY")],
                              [tensor("OUTPUT")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
                              ir_version=ONNX_IR_VERSION, producer_name="modelplex-examples")
    onnx.checker.check_model(model)
    return model


def build_simple_sequence(folder: Path) -> None:
    import onnx

    (folder / "1").mkdir(parents=True)
    onnx.save(sequence_model(), str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(SIMPLE_SEQUENCE_CONFIG)


def build_python(folder: Path, source: str, config: str) -> None:
    (folder / "1").mkdir(parents=True)
    shutil.copyfile(PYTHON_MODELS / source, folder / "1" / "model.py")
    (folder / "config.pbtxt").write_text(config)


BUILDERS = {
    "simple_sequence": build_simple_sequence,
    "simple_dyna_sequence": lambda folder: build_python(folder, "dyna_sequence.py",
                                                        dyna_config("simple_dyna_sequence", "TYPE_UINT64")),
    "simple_string_dyna_sequence": lambda folder: build_python(
        folder, "dyna_sequence.py", dyna_config("simple_string_dyna_sequence", "TYPE_STRING")),
    "simple_sequence_state": lambda folder: build_python(folder, "sequence_state.py", SEQUENCE_STATE_CONFIG),
}
