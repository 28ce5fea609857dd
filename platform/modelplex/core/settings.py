"""Server-wide settings, named after Triton's command-line flags."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .tensors import TensorLimits
from .trace_config import TraceConfig


@dataclass
class ServerConfig:
    model_repositories: list[Path] = field(default_factory=list)
    model_control_mode: str = "none"  # none | explicit | poll
    load_models: list[str] = field(default_factory=list)  # --load-model, "*" for all
    repository_poll_secs: float = 15.0
    strict_readiness: bool = True
    strict_model_config: bool = False
    openai_strict_fields: bool = False  # unknown OpenAI request fields: 400 (True) or a warning once per name
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    http_max_body_bytes: int = 64 * 1024 * 1024
    grpc_max_message_bytes: int = 64 * 1024 * 1024
    tensor_limits: TensorLimits = field(default_factory=TensorLimits)  # per input tensor, at decode time
    max_stream_secs: float = 3600.0  # a stream still running after this ends with an error (0: no limit)
    unload_timeout_secs: float = 30.0
    model_load_timeout_secs: float = 600.0  # a load still running after this fails (0: no limit)
    exit_timeout_secs: float = 30.0  # how long a stop waits for in-flight requests and streams
    load_file_max_bytes: int = 512 * 1024 * 1024
    # Folders LoRA adapters may be loaded from (besides each model's own adapters/ folder).
    lora_adapter_roots: list[Path] = field(default_factory=list)
    server_id: str = "modelplex"
    trace: TraceConfig = field(default_factory=TraceConfig)  # --trace-config
    log_format: str = "text"  # --log-format text | json
    # Model-control routes and RPCs (`api_groups.ADMIN_GROUPS`) on their own listeners, e.g. bound to
    # an internal interface; None keeps them on the main ports.
    admin_host: str | None = None  # default: `host`
    admin_http_port: int | None = None
    admin_grpc_port: int | None = None
    # Values of the flags plugins add to `modelplex serve` (`modelplex_serve_options`), by dest name.
    plugin_options: dict[str, Any] = field(default_factory=dict)
