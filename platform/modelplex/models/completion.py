"""Triton's rules for completing and checking a config.pbtxt against the model file it describes.

Format-neutral: a backend reads its model's inputs and outputs into `TensorSignature`s and names its
format (`"ONNX"`, `"OpenVINO"`) for the messages; the rules are Triton's onnxruntime backend's. A
partial config is completed, never replaced; a contradiction is an `InvalidInput` naming the tensor.
"""
from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as pb

from ..core.errors import InvalidInput
from ..core.tensors import TRITON_TO_CONFIG

# Triton's `--backend-config=onnxruntime,default-max-batch-size` default.
DEFAULT_MAX_BATCH_SIZE = 4


@dataclass(frozen=True, slots=True)
class TensorSignature:
    """One model input or output. `dims` is the model's full shape, batch dimension included (-1 =
    dynamic); `datatype` the Triton datatype, "" when modelplex cannot carry `model_type` (the
    format's own type name, kept for messages)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    model_type: str


def config_data_type(sig: TensorSignature, where: str, model_format: str) -> int:
    """The config.pbtxt `DataType` of a model tensor, or `InvalidInput` when modelplex cannot carry it."""
    if not sig.datatype:
        raise InvalidInput(f"{where} has {model_format} type {sig.model_type}, which modelplex cannot serve")
    return pb.DataType.Value(TRITON_TO_CONFIG[sig.datatype])


def config_shape(tensor, max_batch_size: int) -> list[int]:
    """The shape the model sees for a config tensor: `reshape` if given, else `dims`, behind a -1 batch dim
    when the model batches."""
    shape = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
    return [-1] + shape if max_batch_size > 0 else shape


def is_fully_specified(config) -> bool:
    """Inputs and outputs all have a type and dims: nothing to complete (so no model to read)."""
    tensors = (*config.input, *config.output)
    return bool(config.input and config.output) and all(
        t.data_type != pb.TYPE_INVALID and (t.dims or t.HasField("reshape")) for t in tensors)


def complete_config(config, inputs: list[TensorSignature], outputs: list[TensorSignature], model_format: str) -> None:
    """Fill max_batch_size, the tensors and their types and dims from the model, then `check_config`."""
    _complete_max_batch_size(config, inputs, outputs)
    supplied, state_outputs = sequence_tensor_names(config)
    _complete_tensors(config, config.input, [s for s in inputs if s.name not in supplied], "input", model_format,
                      add_missing=True)
    # A config may list a subset of outputs on purpose; only an empty list means "all of them".
    _complete_tensors(config, config.output, [s for s in outputs if s.name not in state_outputs], "output",
                      model_format, add_missing=not config.output)
    check_config(config, inputs, outputs, model_format)


def check_config(config, inputs: list[TensorSignature], outputs: list[TensorSignature], model_format: str) -> None:
    """Every configured tensor exists in the model with the same datatype and a compatible shape,
    and every model input is configured. Outputs may be a subset (clients only see those)."""
    _check_tensors(config, config.input, inputs, "input", model_format)
    _check_tensors(config, config.output, outputs, "output", model_format)
    # The sequence batcher supplies its control and state inputs: config.pbtxt declares them in
    # sequence_batching, not in `input`.
    declared = {t.name for t in config.input} | sequence_tensor_names(config)[0]
    missing = [s.name for s in inputs if s.name not in declared]
    if missing:
        raise InvalidInput(f"model '{config.name}': {model_format} model input(s) "
                           f"{', '.join(repr(m) for m in missing)} are missing from config.pbtxt")


def sequence_tensor_names(config) -> tuple[set[str], set[str]]:
    """(inputs, outputs) of the model that `sequence_batching` declares: control and state inputs,
    state outputs."""
    sb = config.sequence_batching
    inputs = {c.name for c in sb.control_input} | {s.input_name for s in sb.state}
    return inputs, {s.output_name for s in sb.state}


def _check_tensors(config, declared, model: list[TensorSignature], kind: str, model_format: str) -> None:
    by_name = {s.name: s for s in model}
    for tensor in declared:
        where = f"model '{config.name}': {kind} '{tensor.name}'"
        sig = by_name.get(tensor.name)
        if sig is None:
            raise InvalidInput(f"{where} is not an {kind} of the {model_format} model (its {kind}s: "
                               f"{', '.join(by_name)})")
        expected = config_data_type(sig, where, model_format)
        if tensor.data_type != expected:
            raise InvalidInput(f"{where} has data_type {pb.DataType.Name(tensor.data_type)} in config.pbtxt "
                               f"but {pb.DataType.Name(expected)} in the {model_format} model")
        if config.max_batch_size > 0 and (not sig.dims or sig.dims[0] != -1):
            raise InvalidInput(f"{where} has no variable first dimension in the {model_format} model (dims "
                               f"{list(sig.dims)}), so it cannot take max_batch_size {config.max_batch_size}")
        shape = config_shape(tensor, config.max_batch_size)
        # A dynamic (-1) model dimension accepts any configured size; a fixed one must match exactly.
        if len(shape) != len(sig.dims) or any(m != -1 and c != m for c, m in zip(shape, sig.dims)):
            batch_note = " (the first -1 is the batch dimension)" if config.max_batch_size > 0 else ""
            raise InvalidInput(f"{where} has shape {shape} in config.pbtxt{batch_note} but {list(sig.dims)} "
                               f"in the {model_format} model")


def _complete_max_batch_size(config, inputs: list[TensorSignature], outputs: list[TensorSignature]) -> None:
    """max_batch_size 0 becomes the default when every model tensor has a variable first dimension."""
    if config.max_batch_size != 0:
        return
    model = {s.name: s for s in (*inputs, *outputs)}
    if not all(s.dims and s.dims[0] == -1 for s in model.values()):
        return
    # proto3 cannot tell "0" from "absent": a configured tensor spelling out the model's full rank
    # says there is no batch dimension, so 0 was meant.
    for tensor in (*config.input, *config.output):
        sig = model.get(tensor.name)
        shape = tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims
        if sig is not None and (tensor.dims or tensor.HasField("reshape")) and len(shape) == len(sig.dims):
            return
    config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
    if not config.HasField("dynamic_batching") and not config.HasField("sequence_batching"):
        config.dynamic_batching.SetInParent()


def _complete_tensors(config, declared, model: list[TensorSignature], kind: str, model_format: str,
                      add_missing: bool) -> None:
    batch_dims = 1 if config.max_batch_size > 0 else 0
    by_name = {s.name: s for s in model}
    for tensor in declared:
        sig = by_name.get(tensor.name)
        if sig is None:
            continue  # check_config names it
        if tensor.data_type == pb.TYPE_INVALID:  # not given
            tensor.data_type = config_data_type(sig, f"model '{config.name}': {kind} '{sig.name}'", model_format)
        if not tensor.dims and not tensor.HasField("reshape"):
            _fill_dims(tensor, sig, batch_dims)
    if add_missing:
        present = {t.name for t in declared}
        for sig in model:
            if sig.name not in present:
                tensor = declared.add(name=sig.name)
                tensor.data_type = config_data_type(sig, f"model '{config.name}': {kind} '{sig.name}'", model_format)
                _fill_dims(tensor, sig, batch_dims)


def _fill_dims(tensor, sig: TensorSignature, batch_dims: int) -> None:
    dims = sig.dims[batch_dims:]
    if dims:
        tensor.dims.extend(dims)
    else:
        # A scalar per batch item: clients send [1], an empty reshape hands the model [].
        tensor.dims.append(1)
        tensor.reshape.SetInParent()
