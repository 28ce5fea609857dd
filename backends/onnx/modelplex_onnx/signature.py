"""What an ONNX model declares: its inputs and outputs with Triton datatypes and dims (-1 = dynamic)."""
from __future__ import annotations

from modelplex import TensorSignature

MODEL_FORMAT = "ONNX"  # how messages name the model file's format

# ONNX Runtime's type strings -> Triton datatypes. BF16 and the float8 types have no numpy dtype here.
ORT_TO_TRITON = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


def _dims(shape) -> tuple[int, ...]:
    # ORT reports a dynamic dimension as None or as its symbolic name (a str).
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)


def session_signature(session) -> tuple[list[TensorSignature], list[TensorSignature]]:
    """(inputs, outputs) of an `onnxruntime.InferenceSession`, in the model's order."""
    def convert(args):
        return [TensorSignature(a.name, ORT_TO_TRITON.get(a.type, ""), _dims(a.shape), a.type) for a in args]

    return convert(session.get_inputs()), convert(session.get_outputs())


def read_signature(model_file) -> tuple[list[TensorSignature], list[TensorSignature]]:
    """The signature of an ONNX file, read through a session with every graph optimisation off."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
    return session_signature(session)
