"""Fills what config.pbtxt leaves out from the OpenVINO model, by the ONNX backend's rules (Triton's)."""
from __future__ import annotations

from modelplex import ModelContext

from .devices import shared_core
from .signature import model_signature, read_model


def auto_complete_config(ctx: ModelContext) -> None:
    """Complete `ctx.config` in place from `ctx.model_file`; `InvalidInput` names what contradicts it."""
    # The ONNX backend's rules are format-neutral and belong in the host; until they move there, they are
    # shared from it rather than copied.
    from modelplex_onnx.autocomplete import _complete_max_batch_size, _complete_tensors, _fully_specified
    from modelplex_onnx.config_check import check_config

    config = ctx.config
    if _fully_specified(config):
        return  # each instance checks the config against the model when it loads
    inputs, outputs = model_signature(read_model(shared_core(), ctx), ctx.name)
    _complete_max_batch_size(config, inputs, outputs)
    _complete_tensors(config, config.input, inputs, "input", add_missing=True)
    _complete_tensors(config, config.output, outputs, "output", add_missing=not config.output)
    check_config(config, inputs, outputs)
