"""Fills what config.pbtxt leaves out (max_batch_size, inputs, outputs, their types and dims) from the
ONNX model, by Triton's rules (`modelplex.models.completion`); a partial config is completed, never replaced."""
from __future__ import annotations

from modelplex import InvalidInput, ModelContext, complete_config, is_fully_specified

from .signature import MODEL_FORMAT, read_signature


def auto_complete_config(ctx: ModelContext) -> None:
    """Complete `ctx.config` in place from `ctx.model_file`; `InvalidInput` names what contradicts it."""
    if is_fully_specified(ctx.config):
        return  # as Triton: nothing to fill, so no session to open; each instance checks the config
    if not ctx.model_file.is_file():
        raise InvalidInput(f"model '{ctx.name}': {ctx.model_file} is not a file")
    inputs, outputs = read_signature(ctx.model_file)
    complete_config(ctx.config, inputs, outputs, MODEL_FORMAT)
