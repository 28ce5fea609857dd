"""modelplex: a Triton-compatible model server host; backends plug in through the `modelplex` entry points.

This module is the one stable API plugins import (`from modelplex import ...`); the subpackages behind
it (`core`, `models`, `scheduling`, `observability`, `llm`, the doors and `server`) may move. The
import-linter contracts in pyproject.toml keep plugins on this surface.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .core import params
from .core.api_groups import ADMIN_GROUPS, API_GROUPS, grpc_group, http_group
from .core.backend import (
    BackendSpec,
    EngineStats,
    InstanceContext,
    ModelContext,
    ModelDependency,
    ModelInstance,
    answer_each,
)
from .core.errors import InternalError, InvalidInput, ModelplexError, NotFound, Unavailable, Unsupported
from .core.extensions import AccessControl, Command, Denial, DeviceReport, GrpcTls, HttpTls, ServeOption, parse_bool
from .core.hookspecs import hookimpl
from .core.params import parse_int
from .core.tensors import InferRequest, InferResponse, InferTensor, RequestedOutput
from .llm import tensor_protocol as llm_protocol
from .llm.contract import TextChunk, TokenLogprob
from .llm.tensor_protocol import GenerateInputs
from .llm.tool_parsers import tool_parser
from .models import config as model_config
from .models.adapters import LORA_PARAMETER
from .models.adapters import MODULES_PARAMETER as LORA_MODULES_PARAMETER
from .models.completion import TensorSignature, check_config, complete_config, config_shape, is_fully_specified
from .models.validation import tensor_specs
from .observability.llm_metrics import LLMMetrics
from .observability.trace_spans import current_span

__all__ = [
    "__version__",
    # the backend contract
    "BackendSpec", "ModelContext", "InstanceContext", "ModelInstance", "ModelDependency", "EngineStats",
    "answer_each", "hookimpl",
    "InferRequest", "InferResponse", "InferTensor", "RequestedOutput",
    "ModelplexError", "InvalidInput", "NotFound", "Unavailable", "Unsupported", "InternalError",
    # model configs: Triton's schema, completion from a model file, tensor specs
    "model_config", "TensorSignature", "check_config", "complete_config", "config_shape", "is_fully_specified",
    "tensor_specs",
    # LLM backends: the typed contract, the generate tensors, LoRA parameters, the vllm:* metrics, spans
    "GenerateInputs", "TextChunk", "TokenLogprob",
    "llm_protocol", "tool_parser", "LORA_PARAMETER", "LORA_MODULES_PARAMETER", "LLMMetrics", "current_span",
    # front-door plugins: serve flags, subcommands, access control, TLS, API groups
    "ServeOption", "Command", "AccessControl", "Denial", "HttpTls", "GrpcTls", "DeviceReport", "parse_bool", "params",
    "parse_int",
    "API_GROUPS", "ADMIN_GROUPS", "http_group", "grpc_group",
]
