"""Fills what config.pbtxt leaves out from an exported program's signature (dtypes, dims, dynamic batch),
by Triton's rules (`modelplex.complete_config`). A TorchScript file does not say its shapes or dtypes:
as in Triton, its config must list them, and a config that does not is refused here with the reason."""
from __future__ import annotations

from modelplex import InvalidInput, ModelContext, complete_config, is_fully_specified

from .naming import output_selectors
from .program import EXPORTED, load_program, resolve_model_file


def auto_complete_config(ctx: ModelContext) -> None:
    """Complete `ctx.config` in place; `InvalidInput` names what is missing or contradicts the model."""
    config = ctx.config
    path = resolve_model_file(ctx.version_path, config.default_model_filename)
    config.default_model_filename = path.name  # the config shown to clients names the file served
    if is_fully_specified(config):
        return  # as Triton: nothing to fill, so nothing to load here; each instance checks the config
    if path.suffix != ".pt2":
        raise InvalidInput(f"model '{ctx.name}': a TorchScript model does not reveal its tensors' types and "
                           "shapes; config.pbtxt must list every input and output with data_type and dims")
    program = load_program(ctx.name, path, device=None)
    selectors = output_selectors(ctx.name, [t.name for t in config.output], program.num_results,
                                 program.result_keys)
    inputs, outputs = program.signatures(ctx.name, [t.name for t in config.input], selectors)
    complete_config(config, inputs, outputs, EXPORTED)
