"""Refuses a config.pbtxt that contradicts its ONNX model, naming the tensor and what differs."""
from __future__ import annotations

from modelplex import InvalidInput
from modelplex.tensors import TRITON_TO_CONFIG
from tritonclient.grpc import model_config_pb2 as pb

from .signature import TensorSignature


def config_data_type(sig: TensorSignature, where: str) -> int:
    """The config.pbtxt `DataType` of a model tensor, or `InvalidInput` when modelplex cannot carry it."""
    if not sig.datatype:
        raise InvalidInput(f"{where} has ONNX type {sig.ort_type}, which modelplex cannot serve")
    return pb.DataType.Value(TRITON_TO_CONFIG[sig.datatype])


def config_shape(tensor, max_batch_size: int) -> list[int]:
    """The shape the model sees for a config tensor: `reshape` if given, else `dims`, behind a -1 batch dim
    when the model batches."""
    shape = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
    return [-1] + shape if max_batch_size > 0 else shape


def check_config(config, inputs: list[TensorSignature], outputs: list[TensorSignature]) -> None:
    """Every configured tensor exists in the model with the same datatype and a compatible shape,
    and every model input is configured. Outputs may be a subset (clients only see those)."""
    _check_tensors(config, config.input, inputs, "input")
    _check_tensors(config, config.output, outputs, "output")
    declared = {t.name for t in config.input}
    missing = [s.name for s in inputs if s.name not in declared]
    if missing:
        raise InvalidInput(f"model '{config.name}': ONNX model input(s) {', '.join(repr(m) for m in missing)} "
                           "are missing from config.pbtxt")


def _check_tensors(config, declared, model: list[TensorSignature], kind: str) -> None:
    by_name = {s.name: s for s in model}
    for tensor in declared:
        where = f"model '{config.name}': {kind} '{tensor.name}'"
        sig = by_name.get(tensor.name)
        if sig is None:
            raise InvalidInput(f"{where} is not an {kind} of the ONNX model (its {kind}s: {', '.join(by_name)})")
        expected = config_data_type(sig, where)
        if tensor.data_type != expected:
            raise InvalidInput(f"{where} has data_type {pb.DataType.Name(tensor.data_type)} in config.pbtxt "
                               f"but {pb.DataType.Name(expected)} in the ONNX model")
        if config.max_batch_size > 0 and (not sig.dims or sig.dims[0] != -1):
            raise InvalidInput(f"{where} has no variable first dimension in the ONNX model (dims "
                               f"{list(sig.dims)}), so it cannot take max_batch_size {config.max_batch_size}")
        shape = config_shape(tensor, config.max_batch_size)
        # A dynamic (-1) model dimension accepts any configured size; a fixed one must match exactly.
        if len(shape) != len(sig.dims) or any(m != -1 and c != m for c, m in zip(shape, sig.dims)):
            batch_note = " (the first -1 is the batch dimension)" if config.max_batch_size > 0 else ""
            raise InvalidInput(f"{where} has shape {shape} in config.pbtxt{batch_note} but {list(sig.dims)} "
                               "in the ONNX model")
