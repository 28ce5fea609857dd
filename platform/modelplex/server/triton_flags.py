"""`tritonserver` flags that `modelplex serve` takes so Triton's command lines run unchanged: how each
maps onto modelplex, and the few that cannot apply here (accepted, and warned about once)."""
from __future__ import annotations

import argparse
import logging
import re

from ..core.extensions import parse_bool
from ..observability.logs import LOG_SETTINGS

log = logging.getLogger(__name__)
DEFAULT_BACKEND_DIRECTORY = "/opt/tritonserver/backends"
COMPRESSION_LEVELS = ("none", "low", "medium", "high")


def _bool(text: str) -> bool:
    try:
        return parse_bool(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_triton_flags(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group("Triton's flags")
    g.add_argument("--disable-auto-complete-config", action="store_true",
                   help="never complete a model's config from its model file (as --strict-model-config true; "
                        "default: off)")
    g.add_argument("--allow-client-shm", type=_bool, default=False, metavar="BOOL",
                   help="let clients register system shared-memory regions (/dev/shm objects the server maps) "
                        "for inputs and outputs (as Triton)")
    g.add_argument("--model-load-thread-count", type=int, default=4, metavar="N",
                   help="how many models load at once at startup")
    g.add_argument("--http-address", metavar="ADDRESS",
                   help="address the HTTP port listens on (default: --host)")
    g.add_argument("--grpc-address", metavar="ADDRESS",
                   help="address the gRPC port listens on (default: --host)")
    g.add_argument("--backend-directory", default=DEFAULT_BACKEND_DIRECTORY, metavar="DIR",
                   help="accepted for Triton's command lines; backends are Python plugins found through the "
                        "'modelplex' entry points, so another folder is warned about")
    g.add_argument("--backend-config", action="append", default=[], metavar="<backend>,<setting>=<value>",
                   help="a default parameter for the models of one backend (their config's own parameters "
                        "win); repeatable (default: none)")
    g.add_argument("--id", default="modelplex", help="the server's name in its metadata")
    g.add_argument("--http-header-forward-pattern", default="", metavar="REGEX",
                   help="HTTP headers whose name matches become request parameters of infer and generate "
                        "(default: none)")
    g.add_argument("--grpc-infer-response-compression-level", choices=COMPRESSION_LEVELS, default="none",
                   help="compression of gRPC responses the client accepts compressed")
    g.add_argument("--log-info", type=_bool, default=True, metavar="BOOL", help="log INFO lines")
    g.add_argument("--log-warning", type=_bool, default=True, metavar="BOOL",
                   help="log WARNING lines")
    g.add_argument("--log-error", type=_bool, default=True, metavar="BOOL",
                   help="log ERROR lines")
    g.add_argument("--log-file", default="", metavar="PATH", help="append the log here instead of stderr "
                   "(default: stderr)")


def parse_backend_config(entries: list[str]) -> dict[str, dict[str, str]]:
    """`<backend>,<setting>=<value>` entries by backend; raises ValueError naming a malformed one."""
    settings: dict[str, dict[str, str]] = {}
    for entry in entries:
        backend, comma, rest = entry.partition(",")
        setting, eq, value = rest.partition("=")
        if not comma:  # Triton's global form, `<setting>=<value>`: no backend to give it to
            log.warning("--backend-config %r names no backend: ignored (settings go to one backend's models)", entry)
            continue
        if not backend or not eq or not setting:
            raise ValueError(f"--backend-config expects <backend>,<setting>=<value>, got {entry!r}")
        settings.setdefault(backend, {})[setting] = value
    return settings


def triton_settings(args: argparse.Namespace) -> dict:
    """The `ServerConfig` fields these flags set; raises ValueError on a malformed value."""
    if args.backend_directory != DEFAULT_BACKEND_DIRECTORY:
        log.warning("--backend-directory %s is ignored: backends are Python plugins found through the "
                    "'modelplex' entry points", args.backend_directory)
    if args.model_load_thread_count < 1:
        raise ValueError("--model-load-thread-count must be at least 1")
    try:
        re.compile(args.http_header_forward_pattern)
    except re.error as e:
        raise ValueError(f"--http-header-forward-pattern is not a valid regular expression: {e}") from None
    return {"allow_client_shm": args.allow_client_shm, "http_address": args.http_address,
            "grpc_address": args.grpc_address, "model_load_thread_count": args.model_load_thread_count,
            "backend_config": parse_backend_config(args.backend_config), "server_id": args.id,
            "http_header_forward_pattern": args.http_header_forward_pattern,
            "grpc_compression_level": args.grpc_infer_response_compression_level,
            "strict_model_config": args.strict_model_config or args.disable_auto_complete_config}


def install_logging(args: argparse.Namespace) -> None:
    """Logging as --log-format, --log-verbose, --log-info/-warning/-error and --log-file ask."""
    LOG_SETTINGS.install(args.log_format, args.log_verbose, path=args.log_file or None)
    LOG_SETTINGS.update({"log_info": args.log_info, "log_warning": args.log_warning, "log_error": args.log_error})
