"""The `modelplex` command: `modelplex serve` with Triton's flag names."""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from . import __version__
from .admin_cli import add_admin_commands, run_admin_command
from .errors import InvalidInput
from .logging_setup import LOG_SETTINGS
from .settings import SecurityConfig, ServerConfig
from .tracing import TraceConfig


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelplex", description="A Triton-compatible model server.")
    parser.add_argument("--version", action="version", version=f"modelplex {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the models of one or more model repositories")
    s.add_argument("--model-repository", "--model-store", action="append", required=True, type=Path,
                   help="a Triton model repository folder (repeatable)")
    s.add_argument("--model-control-mode", choices=["none", "explicit", "poll"], default="none")
    s.add_argument("--load-model", action="append", default=[], help="model to load at start in explicit mode; '*' for all")
    s.add_argument("--repository-poll-secs", type=float, default=15.0)
    s.add_argument("--strict-readiness", type=_bool, default=True)
    s.add_argument("--strict-model-config", type=_bool, default=False)
    s.add_argument("--host", default="0.0.0.0", help="address every port listens on")
    s.add_argument("--http-port", type=int, default=8000)
    s.add_argument("--grpc-port", type=int, default=8001)
    s.add_argument("--metrics-port", type=int, default=8002)
    s.add_argument("--allow-http", type=_bool, default=True)
    s.add_argument("--allow-grpc", type=_bool, default=True)
    s.add_argument("--allow-metrics", type=_bool, default=True)
    s.add_argument("--http-max-body-bytes", type=int, default=64 * 1024 * 1024)
    s.add_argument("--grpc-max-message-bytes", type=int, default=64 * 1024 * 1024,
                   help="largest gRPC message received or sent")
    s.add_argument("--unload-timeout-secs", type=float, default=30.0)
    s.add_argument("--exit-timeout-secs", type=float, default=30.0,
                   help="on SIGTERM/SIGINT, how long in-flight requests and streams may run before the exit")
    s.add_argument("--lora-adapter-root", action="append", default=[], type=Path, metavar="DIR",
                   help="a folder LoRA adapters may be loaded from through the adapter APIs, besides each "
                        "model's own adapters/ folder (repeatable)")
    add_security_arguments(s)
    s.add_argument("--port-file", type=Path, help="write the bound ports as JSON here once serving")
    s.add_argument("--log-verbose", type=int, default=0)
    s.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="log lines as text or as JSON objects (each with the request id)")
    s.add_argument("--trace-config", action="append", default=[], metavar="[opentelemetry,]<setting>=<value>",
                   help="Triton's tracing flags: level=OFF|TIMESTAMPS, rate=N, count=N, mode=opentelemetry, "
                        "opentelemetry,url=<OTLP/HTTP endpoint>, opentelemetry,resource=<key>=<value>, "
                        "opentelemetry,bsp_max_queue_size=N (repeatable)")
    add_admin_commands(sub)
    return parser


def add_security_arguments(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group("TLS and access control")
    g.add_argument("--admin-token", action="append", default=[],
                   help="bearer token for model-control APIs (model-repository, trace, logging); repeatable")
    g.add_argument("--admin-token-file", type=Path, help="a file holding the admin token (e.g. a mounted Secret)")
    g.add_argument("--api-key", action="append", default=[], help="bearer key required for inference; repeatable")
    g.add_argument("--api-key-file", type=Path, help="a file with one inference API key per line")
    g.add_argument("--http-restricted-api", action="append", default=[], metavar="<api-groups>:<key>=<value>",
                   help="requests to these API groups must carry header <key> with <value> (Triton's flag)")
    g.add_argument("--grpc-restricted-protocol", action="append", default=[], metavar="<api-groups>:<key>=<value>",
                   help="gRPC calls of these API groups must carry metadata <key> with <value> (Triton's flag)")
    g.add_argument("--http-server-cert", type=Path, help="PEM certificate: serve HTTPS")
    g.add_argument("--http-server-key", type=Path)
    g.add_argument("--http-root-cert", type=Path, help="PEM CA: HTTPS clients must present a certificate it signed")
    g.add_argument("--grpc-use-ssl", type=_bool, default=False)
    g.add_argument("--grpc-use-ssl-mutual", type=_bool, default=False)
    g.add_argument("--grpc-server-cert", type=Path)
    g.add_argument("--grpc-server-key", type=Path)
    g.add_argument("--grpc-root-cert", type=Path)


def _secrets(values: list[str], path: Path | None) -> list[str]:
    if path is not None:
        values = values + [line.strip() for line in path.read_text().splitlines() if line.strip()]
    return values


def security_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> SecurityConfig:
    """The TLS/auth flags as a `SecurityConfig`; contradictions are usage errors (exit 2)."""
    from modelplex_admin.policy import parse_restriction

    try:
        http_restricted = {k: v for text in args.http_restricted_api for k, v in parse_restriction(text).items()}
        grpc_restricted = {k: v for text in args.grpc_restricted_protocol for k, v in parse_restriction(text).items()}
        admin_tokens = _secrets(args.admin_token, args.admin_token_file)
        api_keys = _secrets(args.api_key, args.api_key_file)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    if (args.http_server_cert is None) != (args.http_server_key is None):
        parser.error("--http-server-cert and --http-server-key go together")
    if args.http_root_cert is not None and args.http_server_cert is None:
        parser.error("--http-root-cert needs --http-server-cert and --http-server-key")
    use_ssl = args.grpc_use_ssl or args.grpc_use_ssl_mutual
    if use_ssl and (args.grpc_server_cert is None or args.grpc_server_key is None):
        parser.error("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if args.grpc_use_ssl_mutual and args.grpc_root_cert is None:
        parser.error("--grpc-use-ssl-mutual needs --grpc-root-cert")
    return SecurityConfig(
        admin_tokens=admin_tokens, api_keys=api_keys, http_restricted=http_restricted,
        grpc_restricted=grpc_restricted, http_server_cert=args.http_server_cert,
        http_server_key=args.http_server_key, http_root_cert=args.http_root_cert,
        grpc_server_cert=args.grpc_server_cert if use_ssl else None,
        grpc_server_key=args.grpc_server_key if use_ssl else None,
        grpc_root_cert=args.grpc_root_cert if use_ssl else None, grpc_use_ssl_mutual=args.grpc_use_ssl_mutual)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "serve":
        sys.exit(run_admin_command(args))
    LOG_SETTINGS.install(args.log_format, args.log_verbose)
    try:
        trace = TraceConfig.parse(args.trace_config)
    except InvalidInput as e:
        parser.error(e.message)
    settings = ServerConfig(
        model_repositories=args.model_repository, model_control_mode=args.model_control_mode,
        load_models=args.load_model, repository_poll_secs=args.repository_poll_secs,
        strict_readiness=args.strict_readiness, strict_model_config=args.strict_model_config, host=args.host,
        http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port,
        allow_http=args.allow_http, allow_grpc=args.allow_grpc, allow_metrics=args.allow_metrics,
        http_max_body_bytes=args.http_max_body_bytes, unload_timeout_secs=args.unload_timeout_secs,
        grpc_max_message_bytes=args.grpc_max_message_bytes, trace=trace, log_format=args.log_format,
        exit_timeout_secs=args.exit_timeout_secs, lora_adapter_roots=args.lora_adapter_root,
        security=security_config(parser, args))
    from .server import serve

    try:
        import uvloop

        uvloop.run(serve(settings, args.port_file))
    except ImportError:
        asyncio.run(serve(settings, args.port_file))


if __name__ == "__main__":
    main()
