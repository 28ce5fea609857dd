"""KServe v2 HTTP bodies <-> `InferRequest` / `InferResponse`, in JSON and Triton's binary tensor extension.

A body is a JSON header, optionally followed by raw tensor bytes (`Inference-Header-Content-Length`
gives the header's length). Inputs carry either `data` or `parameters.binary_data_size`; outputs go
back as binary when `binary_data` (per output) or `binary_data_output` (per request) asks for it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import orjson

from ..core.errors import InternalError, InvalidInput
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

# Little-endian dtypes as the wire carries them (BYTES has its own length-prefixed format).
_WIRE_DTYPES = {k: np.dtype(v).newbyteorder("<") for k, v in TRITON_TO_NUMPY.items() if k != "BYTES"}
# numpy kinds a JSON `data` list may infer to for each datatype; anything else is the wrong type.
_INTEGER_KINDS, _FLOAT_KINDS = frozenset("iu"), frozenset("iuf")
_JSON_KINDS = {k: (frozenset("b") if k == "BOOL" else _FLOAT_KINDS if k.startswith("FP") else _INTEGER_KINDS)
               for k in _WIRE_DTYPES}
_KIND_NAMES = {"b": "booleans", "i": "integers", "u": "integers", "f": "floats", "U": "strings", "O": "mixed values"}
_OPT = orjson.OPT_SERIALIZE_NUMPY


@dataclass(slots=True)
class OutputFormat:
    """Which outputs the response carries as binary data: per-output choices over the request default."""

    binary_default: bool = False
    binary: dict[str, bool] = field(default_factory=dict)

    def is_binary(self, name: str) -> bool:
        return self.binary.get(name, self.binary_default)


# ---- request --------------------------------------------------------------------------------
def decode_request(body: bytes | bytearray, header_length: int | None, model_name: str,
                   model_version: str = "", limits: TensorLimits = DEFAULT_LIMITS) -> tuple[InferRequest, OutputFormat]:
    """Parse a v2 infer body. `body` as a bytearray gives writable zero-copy binary inputs."""
    size = len(body)
    if header_length is None:
        header_length = size
    elif not 0 <= header_length <= size:
        raise InvalidInput(f"Inference-Header-Content-Length {header_length} is outside the body of {size} bytes")
    view = memoryview(body)
    try:
        header = orjson.loads(view[:header_length])
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"malformed JSON in the request body: {e}") from None
    if type(header) is not dict:
        raise InvalidInput("the request body must be a JSON object")

    inputs = header.get("inputs")
    if type(inputs) is not list or not inputs:
        raise InvalidInput("the request needs a non-empty 'inputs' list")
    offset = header_length
    tensors = []
    for item in inputs:
        tensor, offset = _decode_input(item, view, offset, size, limits)
        tensors.append(tensor)
    if offset != size:
        raise InvalidInput(f"the body carries {size - header_length} bytes of binary tensor data but the inputs' "
                           f"binary_data_size add up to {offset - header_length}")

    parameters = _dict(header.get("parameters"), "request 'parameters'")
    fmt = OutputFormat(_flag(parameters.pop("binary_data_output", False), "binary_data_output"))
    outputs = [_decode_output(item, fmt) for item in _list(header.get("outputs"), "'outputs'")]
    request_id = header.get("id", "")
    if type(request_id) is not str:
        raise InvalidInput("request 'id' must be a string")
    return InferRequest(model_name, tensors, model_version, request_id, outputs, parameters), fmt


def _decode_input(item, view: memoryview, offset: int, size: int, limits: TensorLimits) -> tuple[InferTensor, int]:
    if type(item) is not dict:
        raise InvalidInput("each entry of 'inputs' must be a JSON object")
    name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
    if type(name) is not str:
        raise InvalidInput("an input has no 'name' string")
    if type(datatype) is not str:
        raise InvalidInput(f"input '{name}' has no 'datatype' string")
    if type(shape) is not list:
        raise InvalidInput(f"input '{name}' needs a 'shape' list of non-negative integers, got {shape!r}")
    for d in shape:
        if type(d) is not int or d < 0:
            raise InvalidInput(f"input '{name}' needs a 'shape' list of non-negative integers, got {shape!r:.200}")
    if datatype != "BYTES" and datatype not in _WIRE_DTYPES:
        raise InvalidInput(f"input '{name}' has unsupported datatype '{datatype}'")
    count = limits.check_shape(name, datatype, shape)
    parameters = _dict(item.get("parameters"), f"input '{name}' parameters")
    binary_size = parameters.pop("binary_data_size", None)
    data = item.get("data")
    if "shared_memory_region" in parameters:
        if data is not None or binary_size is not None:
            raise InvalidInput(f"input '{name}' must set only one of 'data', 'binary_data_size' in 'parameters' "
                               "and 'shared_memory_region' in 'parameters'")
        # no data: the data plane reads it from the region (`shm_tensors.read_inputs`)
        return InferTensor(name, datatype, shape, None, parameters), offset
    if binary_size is not None:
        if data is not None:
            raise InvalidInput(f"input '{name}' has both 'data' and a binary_data_size")
        if type(binary_size) is not int or binary_size < 0:
            raise InvalidInput(f"input '{name}': binary_data_size must be a non-negative integer")
        end = offset + binary_size
        if end > size:
            raise InvalidInput(f"input '{name}' declares {binary_size} bytes of binary data but only "
                               f"{size - offset} bytes are left in the body")
        array = _from_binary(name, datatype, view[offset:end], count, limits)
        offset = end
    elif data is None:
        raise InvalidInput(f"input '{name}' has neither 'data' nor a binary_data_size")
    else:
        array = _from_json(name, datatype, data, count, limits)
    return InferTensor(name, datatype, shape, array.reshape(shape), parameters), offset


def _from_binary(name: str, datatype: str, chunk: memoryview, count: int, limits: TensorLimits) -> np.ndarray:
    if datatype == "BYTES":
        return split_bytes_elements(name, chunk, count, limits)
    dtype = _WIRE_DTYPES[datatype]
    if len(chunk) != count * dtype.itemsize:
        raise InvalidInput(f"input '{name}': binary_data_size is {len(chunk)} bytes but shape and datatype "
                           f"{datatype} need {count * dtype.itemsize}")
    return np.frombuffer(chunk, dtype=dtype)


def _from_json(name: str, datatype: str, data, count: int, limits: TensorLimits) -> np.ndarray:
    if type(data) is not list:
        raise InvalidInput(f"input '{name}': 'data' must be a list")
    if datatype == "BYTES":
        return _json_strings(name, data, count, limits)
    if datatype == "FP16":  # as Triton: JSON numbers cannot say which half-precision value is meant
        raise InvalidInput(f"receiving FP16 data via JSON is not supported. Please use the binary data format "
                           f"for input '{name}'")
    try:
        array = np.array(data)
    except ValueError:
        raise InvalidInput(f"input '{name}': 'data' is ragged or nested too deeply") from None
    if array.size != count:
        raise InvalidInput(f"input '{name}': shape needs {count} elements but 'data' has {array.size}")
    dtype = _WIRE_DTYPES[datatype]
    if array.dtype == dtype:
        return array.reshape(-1)
    if count == 0:
        return np.empty(0, dtype)
    kind = array.dtype.kind
    if kind in "fO" and dtype.kind in "iu":
        # numpy infers floats (or objects) for integers beyond int64 mixed with others: check each value
        return _exact_integers(name, datatype, np.array(data, dtype=np.object_).reshape(-1), dtype, kind)
    if kind not in _JSON_KINDS[datatype]:
        raise InvalidInput(f"input '{name}' has datatype {datatype} but 'data' holds {_KIND_NAMES.get(kind, kind)}")
    if dtype.kind in "iu" and kind in "iu":  # numpy held them exactly: a range check is enough
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise InvalidInput(f"input '{name}': a value in 'data' is out of range for {datatype}")
    return array.astype(dtype).reshape(-1)


def _exact_integers(name: str, datatype: str, values: np.ndarray, dtype: np.dtype, kind: str) -> np.ndarray:
    if any(type(v) is not int for v in values):
        raise InvalidInput(f"input '{name}' has datatype {datatype} but 'data' holds {_KIND_NAMES[kind]}")
    try:
        return np.array(values.tolist(), dtype=dtype)
    except OverflowError:
        raise InvalidInput(f"input '{name}': a value in 'data' is out of range for {datatype}") from None


def _json_strings(name: str, data: list, count: int, limits: TensorLimits) -> np.ndarray:
    flat = _flatten(data) if data and type(data[0]) is list else data
    if len(flat) != count:
        raise InvalidInput(f"input '{name}': shape needs {count} elements but 'data' has {len(flat)}")
    out = np.empty(count, dtype=np.object_)
    for i, s in enumerate(flat):
        if type(s) is not str:
            raise InvalidInput(f"input '{name}' has datatype BYTES: every element of 'data' must be a string")
        out[i] = s.encode()
        if len(out[i]) > limits.max_bytes_element_size:
            limits.check_size(name, i, len(out[i]))
    return out


def _flatten(nested: list) -> list:
    """Row-major leaves of nested lists, iteratively: JSON may nest deeper than Python recursion."""
    flat, stack = [], [iter(nested)]
    while stack:
        for x in stack[-1]:
            if type(x) is list:
                stack.append(iter(x))
                break
            flat.append(x)
        else:
            stack.pop()
    return flat


def _decode_output(item, fmt: OutputFormat) -> RequestedOutput:
    if type(item) is not dict or type(item.get("name")) is not str:
        raise InvalidInput("each entry of 'outputs' must be an object with a 'name' string")
    name = item["name"]
    parameters = _dict(item.get("parameters"), f"output '{name}' parameters")
    if "binary_data" in parameters:
        fmt.binary[name] = _flag(parameters.pop("binary_data"), f"output '{name}' binary_data")
        if fmt.binary[name] and "shared_memory_region" in parameters:
            raise InvalidInput("Output can't set both 'shared_memory_region' and 'binary_data'")
    return RequestedOutput(name, parameters)


def _dict(value, what: str) -> dict:
    if value is None:
        return {}
    if type(value) is not dict:
        raise InvalidInput(f"{what} must be a JSON object")
    return value


def _list(value, what: str) -> list:
    if value is None:
        return []
    if type(value) is not list:
        raise InvalidInput(f"{what} must be a list")
    return value


def _flag(value, what: str) -> bool:
    if type(value) is not bool:
        raise InvalidInput(f"{what} must be true or false")
    return value


# ---- response -------------------------------------------------------------------------------
def encode_response(response: InferResponse, fmt: OutputFormat) -> tuple[bytes, int | None]:
    """The response body and, when binary outputs follow the JSON, the JSON header's length."""
    outputs, chunks = [], []
    for tensor in response.outputs:
        entry = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        parameters = dict(tensor.parameters)
        if tensor.data is None:  # written into shared memory: no data here, as Triton
            pass
        elif fmt.is_binary(tensor.name):
            raw = _to_binary(tensor)
            parameters["binary_data_size"] = len(raw)
            chunks.append(raw)
        else:
            entry["data"] = _to_json(tensor)
        if parameters:
            entry["parameters"] = parameters
        outputs.append(entry)
    header = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        header["id"] = response.id
    if response.parameters:
        header["parameters"] = response.parameters
    header["outputs"] = outputs
    try:
        head = orjson.dumps(header, option=_OPT)
    except TypeError as e:
        raise InternalError(f"the response cannot be written as JSON: {e}") from None
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)


def _to_binary(tensor: InferTensor) -> bytes:
    if tensor.datatype == "BYTES":
        parts = []
        for x in np.asarray(tensor.data).flat:
            b = x.encode() if isinstance(x, str) else bytes(x)
            parts += (BYTES_LENGTH.pack(len(b)), b)
        return b"".join(parts)
    return np.ascontiguousarray(tensor.data, dtype=_WIRE_DTYPES[tensor.datatype]).tobytes()


def _to_json(tensor: InferTensor):
    if tensor.datatype == "BYTES":
        try:
            return [x.decode() if isinstance(x, bytes) else str(x) for x in np.asarray(tensor.data).flat]
        except UnicodeDecodeError:
            raise InvalidInput(f"output '{tensor.name}' holds bytes that are not UTF-8: request it with "
                               "binary_data true") from None
    if tensor.datatype == "FP16":  # as Triton
        raise InvalidInput(f"sending FP16 data via JSON is not supported. Please use the binary data format "
                           f"for output '{tensor.name}'")
    return np.ascontiguousarray(tensor.data, dtype=_WIRE_DTYPES[tensor.datatype]).reshape(-1)


def encode_error(message: str) -> bytes:
    return orjson.dumps({"error": message})
