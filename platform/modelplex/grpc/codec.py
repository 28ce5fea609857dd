"""Tensor codec: Triton's gRPC `ModelInferRequest` -> `InferRequest`, and `InferResponse` -> `ModelInferResponse`.

Inputs come as `raw_input_contents` (little-endian bytes; BYTES elements each prefixed by a 4-byte
little-endian length) or as typed `contents`; outputs always go back as `raw_output_contents`, as Triton does.
"""
from __future__ import annotations

import numbers

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from ..core.errors import InvalidInput
from ..core.shm_tensors import REGION
from ..core.tensors import (
    BYTES_LENGTH,
    DEFAULT_LIMITS,
    TRITON_TO_NUMPY,
    InferRequest,
    InferResponse,
    InferTensor,
    RequestedOutput,
    TensorLimits,
    split_bytes_elements,
)

# The wire is little-endian; on a little-endian host these equal the native dtypes (no byte swapping).
WIRE_DTYPES = {name: np.dtype(t).newbyteorder("<") for name, t in TRITON_TO_NUMPY.items() if name != "BYTES"}

# Which `InferTensorContents` field carries each datatype (FP16 has none: raw only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
    "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

_INT64_MAX = 2**63 - 1


# ---- requests -----------------------------------------------------------------------------
def decode_request(msg: pb.ModelInferRequest, limits: TensorLimits = DEFAULT_LIMITS) -> InferRequest:
    raw = msg.raw_input_contents
    # Inputs in shared memory have no raw entry: the others take theirs in order, as in Triton.
    in_raw = [t for t in msg.inputs if not (t.parameters and REGION in t.parameters)]
    if raw and len(raw) != len(in_raw):
        raise InvalidInput(f"raw_input_contents must hold one entry per input not in shared memory: got "
                           f"{len(raw)} for {len(in_raw)} inputs")
    contents = iter(raw)
    inputs = [decode_tensor(t, None if (not raw or t.parameters and REGION in t.parameters) else next(contents),
                            limits) for t in msg.inputs]
    outputs = [RequestedOutput(o.name, decode_parameters(o.parameters)) for o in msg.outputs]
    return InferRequest(msg.model_name, inputs, msg.model_version, msg.id, outputs,
                        decode_parameters(msg.parameters))


def decode_parameters(params) -> dict:
    """A map of `InferParameter` (a oneof) -> plain Python values."""
    if not params:
        return {}
    return {key: getattr(p, p.WhichOneof("parameter_choice") or "string_param") for key, p in params.items()}


def decode_tensor(t: pb.ModelInferRequest.InferInputTensor, raw: bytes | None,
                  limits: TensorLimits = DEFAULT_LIMITS) -> InferTensor:
    params = t.parameters
    shape = list(t.shape)
    if shape and min(shape) < 0:
        raise InvalidInput(f"input '{t.name}' has a negative dimension in shape {shape!r:.200}")
    datatype = t.datatype
    count = limits.check_shape(t.name, datatype, shape)
    if params and REGION in params:
        if t.HasField("contents"):
            raise InvalidInput(f"unexpected 'content' provided when using shared memory for input tensor "
                               f"'{t.name}'")
        # no data: the data plane reads it from the region (`shm_tensors.read_inputs`)
        return InferTensor(t.name, datatype, shape, None, decode_parameters(params))
    if raw is not None:
        if t.HasField("contents"):
            raise InvalidInput(f"input '{t.name}' carries both raw_input_contents and typed contents")
        data = _from_raw(t.name, datatype, raw, count, limits)
    elif t.HasField("contents"):
        data = _from_contents(t.name, datatype, t.contents, count, limits)
    elif count == 0:
        data = _from_raw(t.name, datatype, b"", 0, limits)
    else:
        raise InvalidInput(f"input '{t.name}' has no data: set raw_input_contents or contents")
    return InferTensor(t.name, datatype, shape, data.reshape(shape), decode_parameters(params))


def _from_raw(name: str, datatype: str, raw: bytes, count: int, limits: TensorLimits) -> np.ndarray:
    if datatype == "BYTES":
        return split_bytes_elements(name, raw, count, limits)
    dtype = WIRE_DTYPES.get(datatype)
    if dtype is None:
        raise InvalidInput(f"input '{name}' has unsupported datatype '{datatype}'")
    if len(raw) != count * dtype.itemsize:
        raise InvalidInput(f"unexpected total byte size {len(raw)} for input '{name}', "
                           f"expecting {count * dtype.itemsize}")
    # A read-only view of the message's bytes: no copy on the hot path.
    return np.frombuffer(raw, dtype=dtype)


def _from_contents(name: str, datatype: str, contents: pb.InferTensorContents, count: int,
                   limits: TensorLimits) -> np.ndarray:
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInput(f"input '{name}': datatype '{datatype}' can only be sent in raw_input_contents"
                           if datatype in WIRE_DTYPES else f"input '{name}' has unsupported datatype '{datatype}'")
    values = getattr(contents, field)
    if len(values) != count:
        raise InvalidInput(f"unexpected number of elements {len(values)} in {field} of input '{name}', "
                           f"expecting {count}")
    if datatype == "BYTES":
        items = np.empty(count, dtype=np.object_)
        items[:] = list(values)
        for i, value in enumerate(values):
            if len(value) > limits.max_bytes_element_size:
                limits.check_size(name, i, len(value))
        return items
    try:
        return np.fromiter(values, dtype=WIRE_DTYPES[datatype], count=count)
    except OverflowError:
        raise InvalidInput(f"input '{name}': a value in {field} does not fit datatype {datatype}") from None


# ---- responses ----------------------------------------------------------------------------
def encode_response(response: InferResponse) -> pb.ModelInferResponse:
    msg = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version,
                                id=response.id, raw_output_contents=[tensor_bytes(t) for t in response.outputs])
    add_output = msg.outputs.add
    for t in response.outputs:
        # data None: written into shared memory (its raw entry is empty, as Triton's)
        header = add_output(name=t.name, datatype=t.datatype, shape=t.shape if t.data is None else t.data.shape)
        if t.parameters:
            encode_parameters(header.parameters, t.parameters)
    if response.parameters:
        encode_parameters(msg.parameters, response.parameters)
    return msg


def tensor_bytes(t: InferTensor) -> bytes:
    """The raw wire bytes of one tensor (C order, little-endian, BYTES length-prefixed)."""
    data = t.data
    if data is None:
        return b""
    if t.datatype == "BYTES":
        return _join_bytes(data)
    dtype = WIRE_DTYPES.get(t.datatype)
    if dtype is None:
        raise InvalidInput(f"output '{t.name}' has unsupported datatype '{t.datatype}'")
    if data.dtype != dtype:
        data = data.astype(dtype)
    return data.tobytes()


def _join_bytes(data: np.ndarray) -> bytes:
    parts = []
    for item in data.flat:
        # Same rule as tritonclient's serialize_byte_tensor: bytes as they are, anything else as UTF-8 text.
        if not isinstance(item, bytes):
            item = item.encode() if isinstance(item, str) else str(item).encode()
        parts.append(BYTES_LENGTH.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def encode_parameters(target, params: dict) -> None:
    """Plain Python values -> a protobuf map of `InferParameter`."""
    for key, value in params.items():
        p = target[key]
        if isinstance(value, (bool, np.bool_)):
            p.bool_param = bool(value)
        elif isinstance(value, numbers.Integral):
            if value > _INT64_MAX:
                p.uint64_param = int(value)
            else:
                p.int64_param = int(value)
        elif isinstance(value, numbers.Real):
            p.double_param = float(value)
        else:
            p.string_param = value if isinstance(value, str) else str(value)
