"""Typed records that plugins return from the front-door hooks (`hookspecs.py`): flags they add to
`modelplex serve`, TLS settings for the HTTP listener, subcommands of `modelplex`. Plugins declare;
the host applies."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


def parse_bool(text: str) -> bool:
    """A command-line boolean as Triton spells them (true/false, 1/0, yes/no, on/off)."""
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


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
class Command:
    """`modelplex <name> ...` from a plugin: `add_arguments` declares its flags on its subparser, `run`
    does the work with the parsed arguments and returns the exit status.

    Example: ``Command("convert-openvino", "convert an LLM for OpenVINO GenAI", add_arguments, run)``
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
