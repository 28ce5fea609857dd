"""Typed records that plugins return from the front-door hooks (`hookspecs.py`): flags they add to
`modelplex serve`, access checks, TLS settings for the listeners, devices, subcommands of
`modelplex`. Plugins declare; the host applies them to HTTP and gRPC alike, so a plugin never needs
a web or RPC framework for these."""
from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from . import params
from .errors import InvalidInput


def parse_bool(text: str) -> bool:
    """A boolean flag's value, as an argparse `type` (argparse reports a ValueError as a usage error)."""
    try:
        return params.parse_bool(text)
    except InvalidInput as e:
        raise ValueError(e.message) from None


@dataclass(frozen=True)
class ServeOption:
    """One `modelplex serve` flag a plugin adds; its parsed value reaches the plugin's hooks as
    `settings.plugin_options[option.dest]`.

    Example: ``ServeOption(("--api-key",), "bearer key required for inference", action="append", default=[])``
    """

    flags: tuple[str, ...]
    help: str
    type: Callable[[str], Any] | None = None
    default: Any = None
    action: str | None = None  # e.g. "append" for a repeatable flag
    metavar: str | None = None
    group: str = "plugins"  # the `--help` section it is listed under

    @property
    def dest(self) -> str:
        return self.flags[0].lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class HttpTls:
    """HTTPS for the HTTP listeners; with `client_ca`, clients must present a certificate it signed."""

    certfile: Path
    keyfile: Path
    client_ca: Path | None = None


@dataclass(frozen=True)
class GrpcTls:
    """TLS for the gRPC listeners (Triton's --grpc-use-ssl); with `root_cert` and `mutual`, clients
    must present a certificate it signed (--grpc-use-ssl-mutual)."""

    certfile: Path
    keyfile: Path
    root_cert: Path | None = None
    mutual: bool = False


@dataclass(frozen=True)
class Denial:
    """Why a request is refused: 401 (no credentials) or 403 (wrong ones), and the message sent.
    The host answers it as HTTP status `status` or gRPC UNAUTHENTICATED / PERMISSION_DENIED."""

    status: int
    message: str


@dataclass(frozen=True)
class AccessControl:
    """A check the host runs before every request of one transport, before any route, body read
    or method: `check(api_group, headers)` gets the request's API group (`api_groups`) and its
    headers or metadata (lower-case names, text values only) and returns a `Denial` or None.

    Example: ``AccessControl("http", policy.check)``
    """

    transport: Literal["http", "grpc"]
    check: Callable[[str, Mapping[str, str]], Denial | None]


@dataclass(frozen=True)
class DeviceReport:
    """The devices one backend's runtime sees, served by the host at `GET /v2/devices`: each a dict
    of what the runtime says of it (at least `name`)."""

    backend: str
    version: str
    devices: list[dict]


@dataclass(frozen=True)
class Command:
    """`modelplex <name> ...` from a plugin: `add_arguments` declares its flags on its subparser, `run`
    does the work with the parsed arguments and returns the exit status.

    Example: ``Command("convert-openvino", "convert an LLM for OpenVINO GenAI", add_arguments, run)``
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
