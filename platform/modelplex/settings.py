"""Server-wide settings, named after Triton's command-line flags."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .tracing import TraceConfig


@dataclass
class SecurityConfig:
    """TLS and access control (`modelplex_admin` enforces it). Empty values mean "off"."""

    admin_tokens: list[str] = field(default_factory=list)  # bearer tokens for model-control endpoints
    api_keys: list[str] = field(default_factory=list)  # bearer keys for the inference group
    # Triton's --http-restricted-api / --grpc-restricted-protocol: API group -> (header, value).
    http_restricted: dict[str, tuple[str, str]] = field(default_factory=dict)
    grpc_restricted: dict[str, tuple[str, str]] = field(default_factory=dict)
    http_server_cert: Path | None = None
    http_server_key: Path | None = None
    http_root_cert: Path | None = None  # set: clients must present a certificate it signed
    grpc_server_cert: Path | None = None
    grpc_server_key: Path | None = None
    grpc_root_cert: Path | None = None
    grpc_use_ssl_mutual: bool = False


@dataclass
class ServerConfig:
    model_repositories: list[Path] = field(default_factory=list)
    model_control_mode: str = "none"  # none | explicit | poll
    load_models: list[str] = field(default_factory=list)  # --load-model, "*" for all
    repository_poll_secs: float = 15.0
    strict_readiness: bool = True
    strict_model_config: bool = False
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    http_max_body_bytes: int = 64 * 1024 * 1024
    grpc_max_message_bytes: int = 64 * 1024 * 1024
    unload_timeout_secs: float = 30.0
    exit_timeout_secs: float = 30.0  # how long a stop waits for in-flight requests and streams
    load_file_max_bytes: int = 512 * 1024 * 1024
    # Folders LoRA adapters may be loaded from (besides each model's own adapters/ folder).
    lora_adapter_roots: list[Path] = field(default_factory=list)
    server_id: str = "modelplex"
    trace: TraceConfig = field(default_factory=TraceConfig)  # --trace-config
    log_format: str = "text"  # --log-format text | json
    security: SecurityConfig = field(default_factory=SecurityConfig)
