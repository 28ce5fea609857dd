"""What Triton's Python models import as `pb_utils`: tensors, requests, responses, BLS, config helpers.

Models written for Triton's Python backend run unchanged: `import triton_python_backend_utils as pb_utils`.
Only numpy is needed; the calls that reach the server (BLS, response senders) work inside a worker.
"""
from __future__ import annotations

import numpy as np

from modelplex_python.protocol import deserialize_bytes, serialize_bytes

from ._config import (  # noqa: F401
    TRITON_STRING_TO_NUMPY,
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    numpy_to_triton_type,
    triton_string_to_numpy,
    triton_to_numpy_type,
    using_decoupled_model_transaction_policy,
)
from ._request import (  # noqa: F401
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponseSender,
    is_model_ready,
    load_model,
    unload_model,
)
from ._types import InferenceResponse, Logger, Tensor, TritonError, TritonModelException  # noqa: F401

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in inference_request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes:
    """Elements as u32 length + bytes, in C order (Triton's BYTES wire format)."""
    return serialize_bytes(input_tensor) if input_tensor.size else b""


def deserialize_bytes_tensor(encoded_tensor) -> np.ndarray:
    """The inverse of `serialize_byte_tensor`: a 1-D object array of bytes."""
    return deserialize_bytes(encoded_tensor, [-1])
