"""KServe v2 request/response objects as the data plane sees them: numpy tensors, no transport."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import InvalidInput

# Triton datatype name -> numpy dtype. BYTES tensors are numpy object arrays of `bytes`.
TRITON_TO_NUMPY: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}
NUMPY_TO_TRITON: dict[Any, str] = {np.dtype(v): k for k, v in TRITON_TO_NUMPY.items()}

# config.pbtxt's DataType enum names ("TYPE_FP32") <-> protocol datatype names ("FP32").
CONFIG_TO_TRITON = {"TYPE_" + k: k for k in TRITON_TO_NUMPY} | {"TYPE_STRING": "BYTES"}
TRITON_TO_CONFIG = {v: k for k, v in CONFIG_TO_TRITON.items() if k != "TYPE_BYTES"}


BYTES_LENGTH = struct.Struct("<I")
MAX_DIMS = 64  # numpy's own limit (NPY_MAXDIMS): a tensor of more dimensions cannot exist


@dataclass(frozen=True, slots=True)
class TensorLimits:
    """What one input tensor may hold, checked while decoding, before the memory is taken. A BYTES
    element costs ~40 bytes of Python object beyond its data, so many tiny elements would take
    ~10x the body's size in memory: their count has a bound of its own."""

    max_elements: int = 1 << 28  # --max-tensor-elements
    max_bytes_elements: int = 1 << 24  # --max-bytes-elements (above the 10M of Triton's own gRPC test)
    max_bytes_element_size: int = 64 << 20  # --max-bytes-element-size

    def check_shape(self, name: str, datatype: str, shape: list[int]) -> int:
        """The element count of a shape of non-negative integers, checked: at most `MAX_DIMS`
        dimensions, the count within the limits, and in a tensor of no element (where numpy would
        fail on it) no dimension above `max_elements` either."""
        if len(shape) > MAX_DIMS:
            raise InvalidInput(f"input '{name}' has {len(shape)} dimensions; a tensor may have at most {MAX_DIMS}")
        count = math.prod(shape)
        self.check_count(name, datatype, count)
        if count == 0 and shape and max(shape) > self.max_elements:
            raise InvalidInput(f"input '{name}' has a dimension of {max(shape)}; the server's limit is "
                               f"{self.max_elements} elements (--max-tensor-elements)")
        return count

    def check_count(self, name: str, datatype: str, count: int) -> None:
        if count > self.max_elements:
            raise InvalidInput(f"input '{name}' has {count} elements; the server's limit is {self.max_elements} "
                               "(--max-tensor-elements)")
        if datatype == "BYTES" and count > self.max_bytes_elements:
            raise InvalidInput(f"input '{name}' has {count} BYTES elements; the server's limit is "
                               f"{self.max_bytes_elements} (--max-bytes-elements)")

    def check_size(self, name: str, index: int, length: int) -> None:
        if length > self.max_bytes_element_size:
            raise InvalidInput(f"input '{name}': BYTES element {index} is {length} bytes; the server's limit is "
                               f"{self.max_bytes_element_size} (--max-bytes-element-size)")


DEFAULT_LIMITS = TensorLimits()


def split_bytes_elements(name: str, raw, count: int, limits: TensorLimits = DEFAULT_LIMITS) -> np.ndarray:
    """Triton's BYTES wire format (HTTP binary data and gRPC raw contents alike): each element is a
    little-endian uint32 length and that many bytes. Returns an object array of `count` bytes."""
    end = len(raw)
    limits.check_count(name, "BYTES", count)
    if count * 4 > end:  # before allocating: a huge shape must not cost memory
        raise InvalidInput(f"input '{name}': {end} bytes of binary data cannot hold the {count} BYTES elements "
                           "its shape needs")
    max_size = limits.max_bytes_element_size
    out = np.empty(count, dtype=np.object_)
    offset = 0
    for i in range(count):
        if offset + 4 > end:
            raise InvalidInput(f"input '{name}': binary BYTES data ends after {i} of {count} elements")
        (length,) = BYTES_LENGTH.unpack_from(raw, offset)
        offset += 4
        if length > max_size:
            limits.check_size(name, i, length)
        if offset + length > end:
            raise InvalidInput(f"input '{name}': BYTES element {i} is {length} bytes long but only "
                               f"{end - offset} bytes remain")
        out[i] = bytes(raw[offset:offset + length])
        offset += length
    if offset != end:
        raise InvalidInput(f"input '{name}': {end - offset} bytes are left after the {count} BYTES elements "
                           "its shape holds")
    return out


def datatype_of(array: np.ndarray) -> str:
    if array.dtype.kind in "SUO":
        return "BYTES"
    try:
        return NUMPY_TO_TRITON[array.dtype]
    except KeyError:
        raise InvalidInput(f"unsupported numpy dtype {array.dtype}") from None


def numpy_dtype(datatype: str):
    try:
        return TRITON_TO_NUMPY[datatype]
    except KeyError:
        raise InvalidInput(f"unsupported datatype '{datatype}'") from None


@dataclass(slots=True)
class InferTensor:
    """A named tensor. `data` is a numpy array of `shape`; BYTES data is an object array of bytes.
    `data` is None only for a tensor in system shared memory (`shm_tensors`): an input the data plane
    has yet to read, or an output it has written."""

    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray | None
    parameters: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_numpy(cls, name: str, array: np.ndarray, **parameters: Any) -> InferTensor:
        if array.dtype.kind in "SU":
            array = np.array([x.encode() if isinstance(x, str) else bytes(x) for x in array.flat],
                             dtype=np.object_).reshape(array.shape)
        return cls(name, datatype_of(array), list(array.shape), array, parameters)


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    """One inference request. `outputs` empty means every output of the model."""

    model_name: str
    inputs: list[InferTensor]
    model_version: str = ""
    id: str = ""
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)

    def input(self, name: str) -> InferTensor:
        for tensor in self.inputs:
            if tensor.name == name:
                return tensor
        raise InvalidInput(f"input '{name}' is missing")


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    outputs: list[InferTensor]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    # Phases the backend measured, for tracing only (never sent to clients): (name, start, end,
    # attributes) on the `time.monotonic_ns` clock, e.g. an LLM's queue and prefill.
    phases: list[tuple[str, int, int, dict]] | None = None
