"""Triton's raw binary request: `Inference-Header-Content-Length: 0` and a body that is the one input's
bytes, for a model with exactly one input. Its datatype and shape come from the model config: batch
dimension 1 when the model batches, one variable dimension worked out from the body's size."""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import InvalidInput
from ..core.tensors import InferRequest, InferTensor, TensorLimits, numpy_dtype
from ..models.validation import tensor_specs
from .codec import OutputFormat


def decode_raw_request(body: bytearray, config, model: str, version: str,
                       limits: TensorLimits) -> tuple[InferRequest, OutputFormat]:
    if len(config.input) != 1:
        raise InvalidInput(f"Raw request must only have 1 input (found 1) to be deduced but got "
                           f"{len(config.input)} inputs in '{model}' model configuration")
    spec = next(iter(tensor_specs(config.input).values()))
    shape = ([1] if config.max_batch_size > 0 else []) + list(spec.dims)
    variable = [i for i, d in enumerate(shape) if d == -1]
    if len(variable) > 1:
        raise InvalidInput(f"The shape of the raw input '{spec.name}' can not be deduced because there are more "
                           "than one variable-sized dimension")
    if spec.datatype == "BYTES":
        if variable or math.prod(shape) != 1:
            raise InvalidInput(f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]")
        limits.check_size(spec.name, 0, len(body))
        data = np.array([bytes(body)], dtype=np.object_)
    else:
        itemsize = np.dtype(numpy_dtype(spec.datatype)).itemsize
        if variable:
            known = math.prod(d for d in shape if d != -1) * itemsize
            if known == 0 or len(body) % known:
                raise InvalidInput(f"raw input '{spec.name}': {len(body)} bytes do not fill a whole number of "
                                   f"{spec.datatype} elements of shape {shape}")
            shape[variable[0]] = len(body) // known
        count = math.prod(shape)
        limits.check_count(spec.name, spec.datatype, count)
        if len(body) != count * itemsize:
            raise InvalidInput(f"input byte size mismatch for input '{spec.name}' for model '{model}'. "
                               f"Expected {count * itemsize}, got {len(body)}")
        data = np.frombuffer(body, dtype=np.dtype(numpy_dtype(spec.datatype)).newbyteorder("<"))
    tensor = InferTensor(spec.name, spec.datatype, shape, data.reshape(shape))
    return InferRequest(model, [tensor], version), OutputFormat(binary_default=True)  # binary outputs, as Triton
