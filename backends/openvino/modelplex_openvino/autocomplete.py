"""Fills what config.pbtxt leaves out from the OpenVINO model, by Triton's rules (`modelplex.models.completion`)."""
from __future__ import annotations

from modelplex import ModelContext, complete_config, is_fully_specified

from .devices import shared_core
from .signature import MODEL_FORMAT, model_signature, read_model


def auto_complete_config(ctx: ModelContext) -> None:
    """Complete `ctx.config` in place from `ctx.model_file`; `InvalidInput` names what contradicts it."""
    if is_fully_specified(ctx.config):
        return  # each instance checks the config against the model when it loads
    inputs, outputs = model_signature(read_model(shared_core(), ctx), ctx.name)
    complete_config(ctx.config, inputs, outputs, MODEL_FORMAT)
