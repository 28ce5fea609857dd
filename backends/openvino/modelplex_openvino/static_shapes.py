"""Reshapes a model's inputs to config.pbtxt's dims: fully static for devices that compile nothing
else (NPU), or as configured for Triton's `RESHAPE_IO_LAYERS: YES`.

For a static device the batch dimension becomes `max_batch_size`; the instance pads smaller batches.
"""
from __future__ import annotations

from modelplex import InvalidInput, config_shape

from .devices import split_device
from .signature import openvino_reason

STATIC_ONLY_DEVICES = ("NPU",)


def needs_static_shapes(device: str) -> bool:
    _, listed = split_device(device)
    return any(d.partition(".")[0] in STATIC_ONLY_DEVICES for d in listed)


def static_shapes(config, why: str) -> dict[str, list[int]]:
    """Input name -> fixed shape; `InvalidInput` naming the input whose config dims stay dynamic."""
    shapes = {}
    for tensor in config.input:
        shape = config_shape(tensor, config.max_batch_size)
        if config.max_batch_size > 0:
            shape[0] = config.max_batch_size
        if any(d < 0 for d in shape):
            raise InvalidInput(f"model '{config.name}': {why} needs static shapes, but input '{tensor.name}' has "
                               f"dims {list(tensor.dims)} in config.pbtxt; give every dimension a fixed size")
        shapes[tensor.name] = shape
    return shapes


def make_static(model, config, why: str) -> None:
    """Reshape `model` in place to `static_shapes`; says so when the model's graph refuses them."""
    _reshape(model, config, static_shapes(config, why), f"{why} needs static shapes, and")


def reshape_to_config(model, config) -> None:
    """Triton's `RESHAPE_IO_LAYERS: YES`: the inputs take config.pbtxt's dims (-1 stays dynamic)."""
    _reshape(model, config, {t.name: config_shape(t, config.max_batch_size) for t in config.input},
             "RESHAPE_IO_LAYERS is set, but")


def _reshape(model, config, shapes: dict[str, list[int]], why: str) -> None:
    try:
        model.reshape(shapes)
    except RuntimeError as e:
        raise InvalidInput(f"model '{config.name}': {why} the model cannot be reshaped to {shapes}: "
                           f"{openvino_reason(e)}") from None
