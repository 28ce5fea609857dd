"""What an OpenVINO model declares: its inputs and outputs as `TensorSignature`s, for the host's
config completion and checks (`modelplex.models.completion`, Triton's rules)."""
from __future__ import annotations

from pathlib import Path

from modelplex import InvalidInput, ModelContext, TensorSignature

MODEL_FORMAT = "OpenVINO"  # how messages name the model file's format
# OpenVINO element type names -> Triton datatypes. Types left out (bf16, u4, f8...) have no numpy
# dtype here, so they stay unservable, as in the ONNX backend.
OV_TO_TRITON = {
    "boolean": "BOOL",
    "u8": "UINT8",
    "u16": "UINT16",
    "u32": "UINT32",
    "u64": "UINT64",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "i64": "INT64",
    "f16": "FP16",
    "f32": "FP32",
    "f64": "FP64",
    "string": "BYTES",  # openvino_tokenizers' text in and out
}


DEFAULT_MODEL_FILENAME = "model.xml"


def version_model_file(ctx: ModelContext) -> Path:
    """The version's model file: `default_model_filename`, or `model.onnx` when the default IR is absent
    (an ONNX model under `backend: "openvino"` needs no `default_model_filename`)."""
    path = ctx.model_file
    onnx_file = ctx.version_path / "model.onnx"
    if path.name == DEFAULT_MODEL_FILENAME and not path.exists() and onnx_file.is_file():
        return onnx_file
    return path


def read_model(core, ctx: ModelContext):
    """`Core.read_model` on the version's model file (IR `.xml` + `.bin`, or `.onnx`), with the reason
    in the error when it cannot be read."""
    model_file = version_model_file(ctx)
    if not model_file.is_file():
        raise InvalidInput(f"model '{ctx.name}': {model_file} is not a file")
    if model_file.suffix == ".xml" and not model_file.with_suffix(".bin").is_file():
        raise InvalidInput(f"model '{ctx.name}': {model_file.with_suffix('.bin').name} is missing next to "
                           f"{model_file.name} (an OpenVINO IR is the .xml graph plus its .bin weights)")
    try:
        return core.read_model(str(model_file))
    except RuntimeError as e:
        raise InvalidInput(f"model '{ctx.name}': OpenVINO cannot read {model_file.name}: "
                           f"{openvino_reason(e)}") from None


def openvino_reason(error: Exception) -> str:
    """OpenVINO's messages start with C++ source locations; the last non-empty line says what went wrong."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else repr(error)


def _signature(port, model_name: str) -> TensorSignature:
    shape = port.get_partial_shape()
    if shape.rank.is_dynamic:
        raise InvalidInput(f"model '{model_name}': tensor '{port.get_any_name()}' has a dynamic rank, which "
                           "config.pbtxt cannot express")
    element = port.get_element_type().get_type_name()
    dims = tuple(d.get_length() if d.is_static else -1 for d in shape)
    return TensorSignature(port.get_any_name(), OV_TO_TRITON.get(element, ""), dims, element)


def model_signature(model, model_name: str) -> tuple[list[TensorSignature], list[TensorSignature]]:
    """(inputs, outputs) of an `openvino.Model`, in the model's order; -1 = a dynamic dimension."""
    return [_signature(p, model_name) for p in model.inputs], [_signature(p, model_name) for p in model.outputs]
