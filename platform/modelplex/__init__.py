"""modelplex: a Triton-compatible model server host; backends plug in through the `modelplex` entry points.

This module is the one stable API plugins import (`from modelplex import ...`); the subpackages behind
it (`core`, `models`, `scheduling`, `observability`, `llm`, the doors and `server`) may move. The
import-linter contracts in pyproject.toml keep plugins on this surface.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .core import params  # noqa: E402
from .core.api_groups import ADMIN_GROUPS, API_GROUPS, grpc_group, http_group  # noqa: E402
from .core.backend import (BackendSpec, EngineStats, InstanceContext, ModelContext,  # noqa: E402
                           ModelDependency, ModelInstance)
from .core.errors import (InternalError, InvalidInput, ModelplexError, NotFound, Unavailable,  # noqa: E402
                          Unsupported)
from .core.extensions import (AccessControl, Command, Denial, DeviceReport, GrpcTls, HttpTls,  # noqa: E402
                              ServeOption, parse_bool)
from .core.hookspecs import hookimpl  # noqa: E402
from .core.params import parse_int  # noqa: E402
from .core.tensors import InferRequest, InferResponse, InferTensor, RequestedOutput  # noqa: E402
from .llm import tensor_protocol as llm_protocol  # noqa: E402
from .llm.tool_parsers import tool_parser  # noqa: E402
from .models import config as model_config  # noqa: E402
from .models.adapters import LORA_PARAMETER, MODULES_PARAMETER as LORA_MODULES_PARAMETER  # noqa: E402
from .models.completion import (TensorSignature, check_config, complete_config, config_shape,  # noqa: E402
                                is_fully_specified)
from .models.validation import tensor_specs  # noqa: E402
from .observability.llm_metrics import LLMMetrics  # noqa: E402
from .observability.trace_spans import current_span  # noqa: E402

__all__ = [
    "__version__",
    # the backend contract
    "BackendSpec", "ModelContext", "InstanceContext", "ModelInstance", "ModelDependency", "EngineStats",
    "hookimpl",
    "InferRequest", "InferResponse", "InferTensor", "RequestedOutput",
    "ModelplexError", "InvalidInput", "NotFound", "Unavailable", "Unsupported", "InternalError",
    # model configs: Triton's schema, completion from a model file, tensor specs
    "model_config", "TensorSignature", "check_config", "complete_config", "config_shape", "is_fully_specified",
    "tensor_specs",
    # LLM backends: the generate tensors, LoRA parameters, the vllm:* metrics, spans
    "llm_protocol", "tool_parser", "LORA_PARAMETER", "LORA_MODULES_PARAMETER", "LLMMetrics", "current_span",
    # front-door plugins: serve flags, subcommands, access control, TLS, API groups
    "ServeOption", "Command", "AccessControl", "Denial", "HttpTls", "GrpcTls", "DeviceReport", "parse_bool", "params", "parse_int",
    "API_GROUPS", "ADMIN_GROUPS", "http_group", "grpc_group",
]
