"""Triton vLLM-backend model folders served unchanged: `backend: "vllm"` with `<version>/model.json`
(vLLM engine arguments) and optionally `<version>/multi_lora.json` ({adapter: folder}).

Auto-complete declares the vLLM backend's tensors and makes the model decoupled; `engine_settings`
maps the engine arguments this engine has to EngineConfig fields (unknown ones are warned about and
ignored). A request's optional BOOL flag tensors (`llm_protocol.VLLM_FLAGS`) are read by the host's
tensor adapter (`modelplex.llm.vllm_tensors`).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from modelplex import LORA_MODULES_PARAMETER, InvalidInput, ModelContext, llm_protocol

log = logging.getLogger(__name__)

BACKEND = "vllm"
ENGINE_ARGS_FILE = "model.json"
LORA_FILE = "multi_lora.json"
OUTPUTS = (("text_output", "TYPE_STRING", [-1]), ("finish_reason", "TYPE_STRING", [-1]),
           ("cumulative_logprob", "TYPE_FP32", [-1]), ("logprobs", "TYPE_STRING", [-1]),
           ("num_input_tokens", "TYPE_UINT32", [1]), ("num_output_tokens", "TYPE_UINT32", [-1]))
# vLLM engine argument -> EngineConfig field; the value converters check types
_INT_ARGS = {"max_model_len": "max_model_len", "max_num_seqs": "max_num_seqs", "block_size": "block_size",
             "max_num_batched_tokens": "max_num_batched_tokens", "seed": "seed", "max_loras": "max_loras",
             "max_lora_rank": "max_lora_rank", "max_cpu_loras": "max_cpu_loras"}
_DTYPES = {"auto": None, "float32": "float32", "float": "float32", "bfloat16": "bfloat16", "float16": "float16",
           "half": "float16"}
# arguments that only tune vLLM itself (logging, parallelism of one device): accepted silently
_QUIET = frozenset({"disable_log_requests", "disable_log_stats", "enable_log_requests", "tensor_parallel_size",
                    "pipeline_parallel_size", "trust_remote_code", "tokenizer", "served_model_name"})


def is_vllm_folder(config) -> bool:
    return config.backend == BACKEND


def auto_complete(ctx: ModelContext) -> None:
    """The vLLM backend's auto-complete: its tensors (plus `messages`, for the OpenAI chat route),
    decoupled, no batching by the host; adapters of multi_lora.json become `lora_modules`."""
    from tritonclient.grpc import model_config_pb2 as pb

    config = ctx.config
    inputs = {t.name for t in config.input}
    for name, kind, dims in (("text_input", "TYPE_STRING", [1]), ("messages", "TYPE_STRING", [1]),
                             ("sampling_parameters", "TYPE_STRING", [1]),
                             *((flag, "TYPE_BOOL", [1]) for flag in llm_protocol.VLLM_FLAGS)):
        if name not in inputs:
            config.input.add(name=name, data_type=pb.DataType.Value(kind), dims=dims, optional=True)
    outputs = {t.name for t in config.output}
    for name, kind, dims in OUTPUTS:
        if name not in outputs:
            config.output.add(name=name, data_type=pb.DataType.Value(kind), dims=dims)
    config.model_transaction_policy.decoupled = True
    config.max_batch_size = 0
    loras = ctx.version_path / LORA_FILE
    if loras.is_file() and LORA_MODULES_PARAMETER not in config.parameters:
        adapters = _read_json(loras, ctx.name)
        config.parameters[LORA_MODULES_PARAMETER].string_value = ",".join(f"{k}={v}" for k, v in adapters.items())


def engine_settings(ctx: ModelContext) -> tuple[str, dict]:
    """(the weights path, EngineConfig fields) from `<version>/model.json`."""
    args = _read_json(ctx.version_path / ENGINE_ARGS_FILE, ctx.name)
    where = f"model '{ctx.name}': {ENGINE_ARGS_FILE}"
    model = args.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidInput(f"{where}: 'model' must name the weights (a .gguf file or an HF folder)")
    path = Path(model) if Path(model).is_absolute() else ctx.version_path / model
    if not path.exists():
        raise InvalidInput(f"{where}: model '{model}' is not a file or folder here (no model hub access: give a "
                           "local path, absolute or relative to the version folder)")
    if path.is_dir() and (path / "model.gguf").is_file():
        path = path / "model.gguf"
    settings: dict = {}
    for key, value in args.items():
        if key == "model":
            continue
        try:
            _map(key, value, settings)
        except (TypeError, ValueError):
            raise InvalidInput(f"{where}: '{key}' has a value of the wrong type: {value!r}") from None
    if args.get("enable_lora") in (True, "true", "True") and not settings.get("max_loras"):
        settings["max_loras"] = 1  # vLLM's default max_loras
    return str(path), settings


def _map(key: str, value, settings: dict) -> None:
    if key in _INT_ARGS:
        if isinstance(value, bool) or int(value) != float(value):
            raise ValueError(key)
        settings[_INT_ARGS[key]] = int(value)
    elif key == "gpu_memory_utilization":
        settings[key] = float(value)
    elif key == "enable_prefix_caching":
        settings[key] = _bool(value)
    elif key == "enforce_eager":
        settings[key] = _bool(value)
    elif key == "dtype":
        if value not in _DTYPES:
            raise ValueError(key)
        settings["dtype"] = _DTYPES[value]
    elif key == "enable_lora":
        _bool(value)
    elif key not in _QUIET:
        log.warning("model.json: ignoring the vLLM engine argument '%s' (this engine has no such setting)", key)


def _bool(value) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ValueError(value)


def _read_json(path: Path, model: str) -> dict:
    if not path.is_file():
        raise InvalidInput(f"model '{model}': a vLLM-backend folder needs {path.name} in its version folder")
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"model '{model}': {path.name} is not readable JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"model '{model}': {path.name} must hold a JSON object")
    return value
