"""The `modelplex` command: `modelplex serve` with Triton's flag names."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from .. import __version__
from ..core.errors import InvalidInput
from ..core.extensions import Command, parse_bool
from ..core.plugins import create_plugin_manager
from ..core.settings import ServerConfig
from ..core.tensors import TensorLimits
from ..observability.tracing import TraceConfig
from .admin_cli import add_admin_commands, run_admin_command
from .triton_flags import add_triton_flags, install_logging, triton_settings


def _bool(text: str) -> bool:
    try:
        return parse_bool(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser(pm=None) -> argparse.ArgumentParser:
    """`modelplex` and its subcommands; `serve` also takes the flags of the plugins in `pm`
    (default: every installed plugin)."""
    parser = argparse.ArgumentParser(prog="modelplex", description="A Triton-compatible model server.")
    parser.add_argument("--version", action="version", version=f"modelplex {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the models of one or more model repositories",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s.add_argument("--model-repository", "--model-store", action="append", required=True, type=Path,
                   help="a Triton model repository folder (repeatable)")
    s.add_argument("--model-control-mode", choices=["none", "explicit", "poll"], default="none",
                   help="none: load every model at start; explicit: load what --load-model names, then only "
                        "through the repository API; poll: load every model and follow repository changes")
    s.add_argument("--load-model", action="append", default=[],
                   help="model to load at start in explicit mode; '*' for all")
    s.add_argument("--repository-poll-secs", type=float, default=15.0,
                   help="in poll mode, seconds between scans of the repositories")
    s.add_argument("--strict-readiness", type=_bool, default=True,
                   help="ready only while every loaded model is READY (false: once the startup load ended)")
    s.add_argument("--strict-model-config", type=_bool, default=False,
                   help="use config.pbtxt as written: no completion from the model file")
    s.add_argument("--exit-on-error", type=_bool, default=True,
                   help="exit non-zero when a model of the startup load fails (false: log it and keep serving "
                        "the others)")
    s.add_argument("--openai-strict-fields", action="store_true",
                   help="refuse unknown fields on the OpenAI routes (400) instead of warning once per field name")
    s.add_argument("--host", default="0.0.0.0", help="address every port listens on")
    s.add_argument("--http-port", type=int, default=8000, help="HTTP port (KServe v2, OpenAI routes); 0: any free")
    s.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (KServe v2, grpc.health.v1); 0: any free")
    s.add_argument("--metrics-port", type=int, default=8002, help="Prometheus /metrics port; 0: any free")
    s.add_argument("--allow-http", type=_bool, default=True, help="serve HTTP")
    s.add_argument("--allow-grpc", type=_bool, default=True, help="serve gRPC")
    s.add_argument("--allow-metrics", type=_bool, default=True, help="serve the metrics port")
    s.add_argument("--http-max-body-bytes", "--http-max-input-size", type=int, default=64 * 1024 * 1024,
                   dest="http_max_body_bytes", metavar="BYTES",
                   help="largest HTTP request body, also once decompressed (Triton's --http-max-input-size)")
    s.add_argument("--grpc-max-message-bytes", type=int, default=64 * 1024 * 1024,
                   help="largest gRPC message received or sent")
    s.add_argument("--grpc-stream-max-inflight", type=int, default=64,
                   help="requests one ModelStreamInfer stream runs at once; beyond it the stream stops reading")
    s.add_argument("--grpc-stream-max-queued-responses", type=int, default=64,
                   help="responses one stream holds for a client reading slowly; beyond it the stream stops reading")
    s.add_argument("--max-request-memory-bytes", type=int, default=1 << 30,
                   help="request bodies in flight, server-wide (HTTP and gRPC infer); beyond it requests are "
                        "refused with 503 / RESOURCE_EXHAUSTED (0: no limit)")
    limits = TensorLimits()
    s.add_argument("--max-tensor-elements", type=int, default=limits.max_elements,
                   help="most elements one input tensor may have")
    s.add_argument("--max-bytes-elements", type=int, default=limits.max_bytes_elements,
                   help="most elements one BYTES input tensor may have "
                        "(each costs ~40 bytes of memory beyond its data)")
    s.add_argument("--max-bytes-element-size", type=int, default=limits.max_bytes_element_size,
                   help="longest BYTES element (e.g. a prompt's text) in bytes")
    s.add_argument("--max-prompt-bytes", type=int, default=4 << 20, metavar="BYTES",
                   help="longest prompt of a text-generation request (its text, or a chat's contents), checked "
                        "before tokenizing, on every route")
    s.add_argument("--max-stream-secs", type=float, default=3600.0,
                   help="a response stream still running after this many seconds ends with an error (0: no limit)")
    s.add_argument("--unload-timeout-secs", type=float, default=30.0,
                   help="how long an unload waits for the model's in-flight requests")
    s.add_argument("--model-load-timeout-secs", "--model-load-timeout", type=float, default=600.0,
                   help="a model whose instances are not all created after this many seconds fails to load "
                        "with that reason, and the server keeps serving (0: no limit)")
    s.add_argument("--exit-timeout-secs", type=float, default=30.0,
                   help="on SIGTERM/SIGINT, how long in-flight requests and streams may run before the exit")
    s.add_argument("--lora-adapter-root", action="append", default=[], type=Path, metavar="DIR",
                   help="a folder LoRA adapters may be loaded from through the adapter APIs, besides each "
                        "model's own adapters/ folder (repeatable)")
    s.add_argument("--admin-host", help="address the admin ports listen on (default: --host)")
    s.add_argument("--admin-http-port", type=int,
                   help="serve model-control routes (repository, adapters, trace, logging) only on this port")
    s.add_argument("--admin-grpc-port", type=int,
                   help="serve model-control RPCs (repository, trace, logging) only on this port")
    add_plugin_arguments(s, pm or create_plugin_manager())
    s.add_argument("--port-file", type=Path, help="write the bound ports as JSON here once serving")
    s.add_argument("--log-verbose", type=int, default=0, metavar="LEVEL",
                   help="verbose (DEBUG) lines when above 0")
    add_triton_flags(s)
    s.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="log lines as text or as JSON objects (each with the request id)")
    s.add_argument("--trace-config", action="append", default=[], metavar="[opentelemetry,]<setting>=<value>",
                   help="Triton's tracing flags: level=OFF|TIMESTAMPS, rate=N, count=N, mode=opentelemetry, "
                        "opentelemetry,url=<OTLP/HTTP endpoint>, opentelemetry,resource=<key>=<value>, "
                        "opentelemetry,bsp_max_queue_size=N (repeatable)")
    s.add_argument("--access-log", type=_bool, nargs="?", const=True, default=False,
                   help="log one line per HTTP request and gRPC call: method, path, model, status, latency, "
                        "request id")
    add_admin_commands(sub)
    for command in plugin_commands(pm or create_plugin_manager()).values():
        command.add_arguments(sub.add_parser(command.name, help=command.help))
    return parser


def plugin_commands(pm) -> dict[str, Command]:
    """The plugins' subcommands by name (the first plugin to declare a name wins)."""
    commands: dict[str, Command] = {}
    for declared in pm.hook.modelplex_commands():
        for command in declared or ():
            commands.setdefault(command.name, command)
    return commands


def add_plugin_arguments(s: argparse.ArgumentParser, pm) -> None:
    """The flags plugins declare (`modelplex_serve_options`), listed under the group each names."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for options in pm.hook.modelplex_serve_options():
        for option in options or ():
            group = groups.get(option.group) or groups.setdefault(option.group, s.add_argument_group(option.group))
            kwargs = {"help": option.help, "default": option.default, "dest": option.dest}
            kwargs |= {k: v for k, v in (("type", option.type), ("action", option.action),
                                         ("metavar", option.metavar)) if v is not None}
            group.add_argument(*option.flags, **kwargs)


def plugin_options(pm, args: argparse.Namespace) -> dict:
    return {option.dest: getattr(args, option.dest)
            for options in pm.hook.modelplex_serve_options() for option in options or ()}


def main(argv: list[str] | None = None) -> None:
    pm = create_plugin_manager()
    parser = build_parser(pm)
    args = parser.parse_args(argv)
    commands = plugin_commands(pm)
    if args.command in commands:
        sys.exit(commands[args.command].run(args))
    if args.command != "serve":
        sys.exit(run_admin_command(args))
    install_logging(args)
    try:
        trace = TraceConfig.parse(args.trace_config)
        triton = triton_settings(args)
    except InvalidInput as e:
        parser.error(e.message)
    except ValueError as e:
        parser.error(str(e))
    settings = ServerConfig(
        model_repositories=args.model_repository, model_control_mode=args.model_control_mode,
        load_models=args.load_model, repository_poll_secs=args.repository_poll_secs,
        strict_readiness=args.strict_readiness, host=args.host, openai_strict_fields=args.openai_strict_fields,
        http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port,
        allow_http=args.allow_http, allow_grpc=args.allow_grpc, allow_metrics=args.allow_metrics,
        http_max_body_bytes=args.http_max_body_bytes, unload_timeout_secs=args.unload_timeout_secs,
        model_load_timeout_secs=args.model_load_timeout_secs, max_stream_secs=args.max_stream_secs,
        tensor_limits=TensorLimits(args.max_tensor_elements, args.max_bytes_elements, args.max_bytes_element_size),
        grpc_max_message_bytes=args.grpc_max_message_bytes, trace=trace, log_format=args.log_format,
        lora_adapter_roots=args.lora_adapter_root, exit_timeout_secs=args.exit_timeout_secs, admin_host=args.admin_host,
        admin_http_port=args.admin_http_port, admin_grpc_port=args.admin_grpc_port,
        plugin_options=plugin_options(pm, args), exit_on_error=args.exit_on_error, access_log=args.access_log,
        grpc_stream_max_inflight=args.grpc_stream_max_inflight, max_request_memory_bytes=args.max_request_memory_bytes,
        grpc_stream_max_queued_responses=args.grpc_stream_max_queued_responses,
        max_prompt_bytes=args.max_prompt_bytes, **triton)
    try:
        pm.hook.modelplex_check_settings(settings=settings)
    except ValueError as e:
        parser.error(str(e))
    from .assembly import serve

    try:
        import uvloop
    except ImportError:
        code = asyncio.run(serve(settings, args.port_file, pm))
    else:
        code = uvloop.run(serve(settings, args.port_file, pm))
    # `serve` has stopped everything. Leave without the interpreter's finalization: with torch loaded it took
    # 4-5 s on a busy 2-core machine (past the grace SIGTERM promises), and an engine thread still inside a
    # step would run on meanwhile.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
