"""Tensors, responses and errors as Triton's Python models build and read them."""
from __future__ import annotations

import json
import logging
import sys

import numpy as np

from modelplex_python.protocol import triton_datatype

# Triton's TRITONSERVER_DataType codes, as `Tensor.triton_dtype()` returns them.
DATATYPE_CODES = {"BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
                  "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13}


class TritonModelException(Exception):
    """Raised by models (and by this module) for a failure the client should see."""

    def message(self) -> str:
        return str(self)


class TritonError:
    """An error carried by an `InferenceResponse`; `code` is one of the class constants."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = INTERNAL):
        self._message, self._code = str(message), int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class Tensor:
    """A named numpy array. Text (str/bytes) arrays are held as object arrays of bytes, as Triton does."""

    def __init__(self, name: str, array):
        array = np.asarray(array)  # as Triton's binding does: lists and scalars are accepted too
        if array.dtype.kind == "O" and not all(isinstance(x, (bytes, str)) for x in array.flat):
            raise TritonModelException(f"Tensor '{name}': an object array may hold only bytes or str "
                                       "(BYTES elements)")
        if array.dtype.kind in "SU":
            array = np.array([x.encode() if isinstance(x, str) else bytes(x) for x in array.flat],
                             dtype=np.object_).reshape(array.shape)
        try:
            self._datatype = triton_datatype(array)
        except ValueError as e:
            raise TritonModelException(f"Tensor '{name}': {e}") from None
        self._name, self._array = str(name), array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int:
        return DATATYPE_CODES[self._datatype]

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self):
        return self._array.__dlpack__()

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()

    @staticmethod
    def from_dlpack(name: str, tensor) -> Tensor:
        """From any object with `__dlpack__` (a torch tensor, another pb_utils.Tensor)."""
        return Tensor(name, np.from_dlpack(tensor))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._datatype}, {list(self._array.shape)})"


class InferenceResponse:
    def __init__(self, output_tensors=(), error: TritonError | None = None, parameters: dict | None = None):
        self._outputs = list(output_tensors)
        self._error = error
        self._parameters = dict(parameters or {})

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response parameters as a JSON string (as Triton returns them)."""
        return json.dumps(self._parameters)


class Logger:
    """Triton's model logger; lines go to the worker's stderr, which is the server's log."""

    INFO, WARNING, ERROR, VERBOSE = logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG
    _log = logging.getLogger("triton_python_model")

    @staticmethod
    def log(message: str, level: int = logging.INFO) -> None:
        Logger._log.log(level, message)

    @staticmethod
    def log_info(message: str) -> None:
        Logger._log.info(message)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger._log.warning(message)

    @staticmethod
    def log_error(message: str) -> None:
        Logger._log.error(message)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger._log.debug(message)


def _configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s python model: %(message)s"))
    Logger._log.addHandler(handler)
    Logger._log.setLevel(logging.INFO)
    Logger._log.propagate = False


_configure_logging()
