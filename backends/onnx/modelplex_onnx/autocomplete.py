"""Fills what config.pbtxt leaves out (max_batch_size, inputs, outputs, their types and dims) from the
ONNX model, as Triton's onnxruntime backend does; a partial config is completed, never replaced."""
from __future__ import annotations

from modelplex import InvalidInput, ModelContext
from tritonclient.grpc import model_config_pb2 as pb

from .config_check import check_config, config_data_type
from .signature import TensorSignature, read_signature

# Triton's `--backend-config=onnxruntime,default-max-batch-size` default.
DEFAULT_MAX_BATCH_SIZE = 4


def auto_complete_config(ctx: ModelContext) -> None:
    """Complete `ctx.config` in place from `ctx.model_file`; `InvalidInput` names what contradicts it."""
    config = ctx.config
    if _fully_specified(config):
        return  # as Triton: nothing to fill, so no session to open; each instance checks the config
    if not ctx.model_file.is_file():
        raise InvalidInput(f"model '{ctx.name}': {ctx.model_file} is not a file")
    inputs, outputs = read_signature(ctx.model_file)
    _complete_max_batch_size(config, inputs, outputs)
    _complete_tensors(config, config.input, inputs, "input", add_missing=True)
    # A config may list a subset of outputs on purpose; only an empty list means "all of them".
    _complete_tensors(config, config.output, outputs, "output", add_missing=not config.output)
    check_config(config, inputs, outputs)


def _fully_specified(config) -> bool:
    tensors = (*config.input, *config.output)
    return bool(config.input and config.output) and all(
        t.data_type != pb.TYPE_INVALID and (t.dims or t.HasField("reshape")) for t in tensors)


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


def _complete_tensors(config, declared, model: list[TensorSignature], kind: str, add_missing: bool) -> None:
    batch_dims = 1 if config.max_batch_size > 0 else 0
    by_name = {s.name: s for s in model}
    for tensor in declared:
        sig = by_name.get(tensor.name)
        if sig is None:
            continue  # check_config names it
        if tensor.data_type == pb.TYPE_INVALID:  # not given
            tensor.data_type = config_data_type(sig, f"model '{config.name}': {kind} '{sig.name}'")
        if not tensor.dims and not tensor.HasField("reshape"):
            _fill_dims(tensor, sig, batch_dims)
    if add_missing:
        present = {t.name for t in declared}
        for sig in model:
            if sig.name not in present:
                tensor = declared.add(name=sig.name)
                tensor.data_type = config_data_type(sig, f"model '{config.name}': {kind} '{sig.name}'")
                _fill_dims(tensor, sig, batch_dims)


def _fill_dims(tensor, sig: TensorSignature, batch_dims: int) -> None:
    dims = sig.dims[batch_dims:]
    if dims:
        tensor.dims.extend(dims)
    else:
        # A scalar per batch item: clients send [1], an empty reshape hands the model [].
        tensor.dims.append(1)
        tensor.reshape.SetInParent()
