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
    exit_on_error: bool = True  # a failed startup load ends the process (non-zero)
    access_log: bool = False  # one log line per HTTP request and gRPC call
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
    # One ModelStreamInfer stream: requests it runs at once and responses queued for a client that reads
    # slowly; when either is full the stream stops reading requests (gRPC's flow control holds the client).
    grpc_stream_max_inflight: int = 64
    grpc_stream_max_queued_responses: int = 64
    max_request_memory_bytes: int = 1 << 30  # request bodies in flight, server-wide (0: no limit)
    tensor_limits: TensorLimits = field(default_factory=TensorLimits)  # per input tensor, at decode time
    max_prompt_bytes: int = 4 << 20  # a generate request's prompt text (or chat contents), before tokenizing
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
    # Triton's flags of issue 26 (part 2)
    allow_client_shm: bool = False  # --allow-client-shm: clients may register system shared memory
    http_address: str | None = None  # --http-address (default: `host`)
    grpc_address: str | None = None  # --grpc-address (default: `host`)
    model_load_thread_count: int = 4  # --model-load-thread-count: models loading at once at startup
    # --backend-config <backend>,<setting>=<value>: default parameters of that backend's models
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    http_header_forward_pattern: str = ""  # --http-header-forward-pattern: headers sent on as parameters
    grpc_compression_level: str = "none"  # --grpc-infer-response-compression-level
    # Values of the flags plugins add to `modelplex serve` (`modelplex_serve_options`), by dest name.
    plugin_options: dict[str, Any] = field(default_factory=dict)
