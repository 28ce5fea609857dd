"""Server logging: text or JSON lines, the id of the request being served on each line, and Triton's
run-time log settings (`/v2/logging`, gRPC `LogSettings`).

Python's logging is process-wide, so these settings are too: one `LogSettings` per process.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from typing import TYPE_CHECKING

from ..core.errors import InvalidInput

if TYPE_CHECKING:
    from ..core.tensors import InferRequest

# The request being served; its id is worked out only when a line is written.
current_request: ContextVar[InferRequest | None] = ContextVar("modelplex_current_request", default=None)
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


def bind_request(request: InferRequest) -> None:
    """Called by the data plane for every request; an ensemble step or a BLS call runs in its
    caller's context and keeps the caller's request (and so its id)."""
    if current_request.get() is None:
        current_request.set(request)


def request_id_of(request: InferRequest | None) -> str:
    """The client's id, else one made from the request object's identity (unique while it runs)."""
    if request is None:
        return "-"
    return request.id or f"#{id(request) & 0xFFFFFFFF:08x}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                + f".{int(record.msecs):03d}Z", "level": record.levelname, "logger": record.name,
                "request_id": record.request_id, "message": record.getMessage()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class LogSettings(logging.Filter):
    """Triton's switches (log_info/warning/error, log_verbose_level, log_format); also the filter
    that stamps each record with its request id and drops the levels switched off."""

    def __init__(self):
        super().__init__()
        self.log_info = self.log_warning = self.log_error = True
        self.log_verbose_level = 0
        self.log_format = "text"
        self.log_file = ""  # --log-file; empty: stderr
        self.handler: logging.Handler | None = None

    def install(self, log_format: str = "text", verbose_level: int = 0, stream=None, path: str | None = None) -> None:
        """Replace the root logger's handlers with one writing in `log_format` to the file `path`
        (appended; --log-file) or else to `stream` (stderr)."""
        root = logging.getLogger()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        self.log_file = path or ""
        self.handler = (logging.FileHandler(path, encoding="utf-8") if path
                        else logging.StreamHandler(stream or sys.stderr))
        self.handler.addFilter(self)
        root.addHandler(self.handler)
        self.update({"log_format": log_format, "log_verbose_level": verbose_level})

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_of(current_request.get())
        level = record.levelno
        if level >= logging.ERROR:
            return self.log_error
        if level >= logging.WARNING:
            return self.log_warning
        if level >= logging.INFO:
            return self.log_info
        return self.log_verbose_level > 0

    def settings(self) -> dict:
        return {"log_file": self.log_file, "log_info": self.log_info, "log_warning": self.log_warning,
                "log_error": self.log_error, "log_verbose_level": self.log_verbose_level,
                "log_format": self.log_format}

    def update(self, changes: dict) -> dict:
        """Validate every change first, then apply them all; unknown keys are refused."""
        parsed = {key: _parse(key, value) for key, value in changes.items()}
        for key, value in parsed.items():
            setattr(self, key, value)
        logging.getLogger().setLevel(logging.DEBUG if self.log_verbose_level else logging.INFO)
        if self.handler is not None:
            self.handler.setFormatter(JsonFormatter() if self.log_format == "json" else logging.Formatter(TEXT_FORMAT))
        return self.settings()


def _parse(key: str, value):
    if key in ("log_info", "log_warning", "log_error"):
        if type(value) is not bool:
            raise InvalidInput(f"log setting '{key}' must be true or false, got {value!r}")
        return value
    if key == "log_verbose_level":
        if type(value) is not int or value < 0:
            raise InvalidInput(f"log setting 'log_verbose_level' must be a non-negative integer, got {value!r}")
        return value
    if key == "log_format":
        if value not in FORMATS:
            raise InvalidInput(f"log setting 'log_format' must be one of {', '.join(FORMATS)}, got {value!r}")
        return value
    if key == "log_file":
        raise InvalidInput("log setting 'log_file' cannot be changed at run time: start the server with --log-file")
    raise InvalidInput(f"unknown log setting '{key}' (expected log_info, log_warning, log_error, "
                       "log_verbose_level or log_format)")


LOG_SETTINGS = LogSettings()
