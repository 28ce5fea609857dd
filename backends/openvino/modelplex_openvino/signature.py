"""What an OpenVINO model declares: its inputs and outputs as the ONNX backend's `TensorSignature`s,
so the config completion and checks are the ONNX backend's own (Triton's rules for both)."""
from __future__ import annotations

from pathlib import Path

from modelplex import InvalidInput, ModelContext
from modelplex_onnx.signature import TensorSignature

# OpenVINO element type names -> the ONNX type names `TensorSignature` speaks (the ONNX frontend maps
# them one to one). Types left out (bf16, u4, f8...) stay unservable, as in the ONNX backend.
OV_TO_ONNX_TYPE = {
    "boolean": "tensor(bool)",
    "u8": "tensor(uint8)",
    "u16": "tensor(uint16)",
    "u32": "tensor(uint32)",
    "u64": "tensor(uint64)",
    "i8": "tensor(int8)",
    "i16": "tensor(int16)",
    "i32": "tensor(int32)",
    "i64": "tensor(int64)",
    "f16": "tensor(float16)",
    "f32": "tensor(float)",
    "f64": "tensor(double)",
    "string": "tensor(string)",  # openvino_tokenizers' text in and out
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
        raise InvalidInput(f"model '{ctx.name}': OpenVINO cannot read {model_file.name}: {openvino_reason(e)}") from None


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
    return TensorSignature(port.get_any_name(), OV_TO_ONNX_TYPE.get(element, f"openvino {element}"), dims)


def model_signature(model, model_name: str) -> tuple[list[TensorSignature], list[TensorSignature]]:
    """(inputs, outputs) of an `openvino.Model`, in the model's order; -1 = a dynamic dimension."""
    return [_signature(p, model_name) for p in model.inputs], [_signature(p, model_name) for p in model.outputs]
