"""modelplex: a Triton-compatible model server host; backends plug in through the `modelplex` entry points."""
from __future__ import annotations

__version__ = "0.1.0"

from .adapters import LORA_PARAMETER, MODULES_PARAMETER as LORA_MODULES_PARAMETER  # noqa: E402
from .backend import BackendSpec, InstanceContext, ModelContext, ModelInstance  # noqa: E402
from .errors import (InternalError, InvalidInput, ModelplexError, NotFound, Unavailable,  # noqa: E402
                     Unsupported)
from .hookspecs import hookimpl  # noqa: E402
from .tensors import InferRequest, InferResponse, InferTensor, RequestedOutput  # noqa: E402

__all__ = ["BackendSpec", "InstanceContext", "ModelContext", "ModelInstance", "InferRequest", "InferResponse",
           "InferTensor", "RequestedOutput", "ModelplexError", "InvalidInput", "NotFound", "Unavailable",
           "Unsupported", "InternalError", "hookimpl", "LORA_PARAMETER", "LORA_MODULES_PARAMETER", "__version__"]
