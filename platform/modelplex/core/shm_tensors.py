"""Tensors in system shared memory: inputs read from a registered region (numeric data without a
copy) and requested outputs written into one, as a request's shared-memory parameters say.

The doors leave an input that names a region without data (`data is None`); the data plane fills it
here before the model sees it. An output written into a region goes back with `data is None`: the
response then carries its datatype and shape only, as Triton's does.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import InvalidInput
from .shared_memory import SharedMemoryRegistry
from .tensors import (
    BYTES_LENGTH,
    TRITON_TO_NUMPY,
    InferRequest,
    InferResponse,
    InferTensor,
    TensorLimits,
    split_bytes_elements,
)

REGION, OFFSET, BYTE_SIZE = "shared_memory_region", "shared_memory_offset", "shared_memory_byte_size"
_WIRE = {k: np.dtype(v).newbyteorder("<") for k, v in TRITON_TO_NUMPY.items() if k != "BYTES"}


def shm_parameters(name: str, parameters: dict) -> tuple[str, int, int] | None:
    """(region, offset, byte_size) when a tensor's parameters name a region, else None."""
    if REGION not in parameters:
        for key in (OFFSET, BYTE_SIZE):
            if key in parameters:
                raise InvalidInput(f"'{key}' can not be specified without 'shared_memory_region' parameter "
                                   f"for tensor '{name}'")
        return None
    region, offset, byte_size = parameters[REGION], parameters.get(OFFSET, 0), parameters.get(BYTE_SIZE)
    if type(region) is not str:
        raise InvalidInput(f"invalid value type for 'shared_memory_region' parameter for tensor '{name}', "
                           "expected a string")
    if byte_size is None:
        raise InvalidInput(f"'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
                           f"parameter for tensor '{name}'")
    for key, value in ((OFFSET, offset), (BYTE_SIZE, byte_size)):
        if type(value) is not int or value < 0:
            raise InvalidInput(f"invalid value for '{key}' parameter for tensor '{name}', expected a "
                               "non-negative integer")
    return region, offset, byte_size


def read_inputs(request: InferRequest, registry: SharedMemoryRegistry, limits: TensorLimits) -> None:
    """Give every input the doors left without data its data from the region it names."""
    for tensor in request.inputs:
        if tensor.data is not None:
            continue
        region, offset, byte_size = shm_parameters(tensor.name, tensor.parameters)
        view = registry.get(region).view(offset, byte_size)
        count = math.prod(tensor.shape)
        if tensor.datatype == "BYTES":
            data = split_bytes_elements(tensor.name, view, count, limits)
        else:
            dtype = _WIRE.get(tensor.datatype)
            if dtype is None:
                raise InvalidInput(f"input '{tensor.name}' has unsupported datatype '{tensor.datatype}'")
            if byte_size != count * dtype.itemsize:
                raise InvalidInput(f"input byte size mismatch for input '{tensor.name}' for model "
                                   f"'{request.model_name}'. Expected {count * dtype.itemsize}, got {byte_size}")
            data = np.frombuffer(view, dtype=dtype)  # a view of the mapping: no copy
        tensor.data = data.reshape(tensor.shape)


def output_targets(request: InferRequest, registry: SharedMemoryRegistry) -> dict[str, memoryview]:
    """Where each requested output that names a region goes, resolved (and bounds checked) before
    the model runs, so a bad region costs no inference; the views hold their mappings meanwhile."""
    targets = {}
    for output in request.outputs:
        found = shm_parameters(output.name, output.parameters) if output.parameters else None
        if found is not None:
            if "classification" in output.parameters:
                raise InvalidInput("output can't set both 'shared_memory_region' and 'classification'")
            region, offset, byte_size = found
            targets[output.name] = registry.get(region).view(offset, byte_size)
    return targets


def write_outputs(response: InferResponse, targets: dict[str, memoryview]) -> None:
    """Write the targeted outputs into their regions; they then go back without data. (The views are
    let go with the request: a region unregistered meanwhile is unmapped then.)"""
    for i, tensor in enumerate(response.outputs):
        view = targets.get(tensor.name)
        if view is not None:
            _write(tensor, view)
            response.outputs[i] = InferTensor(tensor.name, tensor.datatype, list(np.shape(tensor.data)), None)


def _write(tensor: InferTensor, view: memoryview) -> None:
    data = np.asarray(tensor.data)
    if tensor.datatype == "BYTES":
        raw = b"".join(part for item in data.flat for part in _element(item))
        _check_fits(tensor.name, len(view), len(raw))
        view[:len(raw)] = raw
    else:
        wire = _WIRE[tensor.datatype]
        _check_fits(tensor.name, len(view), data.size * wire.itemsize)
        np.frombuffer(view, dtype=wire, count=data.size).reshape(data.shape)[...] = data  # the one copy


def _check_fits(name: str, have: int, need: int) -> None:
    if need > have:
        raise InvalidInput(f"shared memory size specified with the request for output '{name}' ({have} bytes) "
                           f"should be at least {need} bytes to hold the results")


def _element(item) -> tuple[bytes, bytes]:
    """One BYTES element in Triton's wire form: its little-endian uint32 length, then its bytes."""
    b = item if isinstance(item, bytes) else (item if isinstance(item, str) else str(item)).encode()
    return BYTES_LENGTH.pack(len(b)), b
