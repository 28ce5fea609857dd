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
from .settings import ServerConfig
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
        grpc_max_message_bytes=args.grpc_max_message_bytes, trace=trace, log_format=args.log_format)
    from .server import serve

    try:
        import uvloop

        uvloop.run(serve(settings, args.port_file))
    except ImportError:
        asyncio.run(serve(settings, args.port_file))


if __name__ == "__main__":
    main()
