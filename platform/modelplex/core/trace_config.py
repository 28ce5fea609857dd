"""`--trace-config` as Triton spells it, parsed into the settings tracing runs with
(`observability.tracing` applies them)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .errors import InvalidInput
from .params import parse_int

LEVELS = ("OFF", "TIMESTAMPS")


def default_otlp_url(env) -> str:
    """OpenTelemetry's environment variables, else the local collector's OTLP/HTTP address."""
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    return "http://localhost:4318/v1/traces"


@dataclass
class TraceConfig:
    """`--trace-config` as Triton spells it: level/rate/count/mode, and `opentelemetry,<key>=<value>`."""

    level: str = "OFF"
    rate: int = 1000
    count: int = -1
    url: str = field(default_factory=lambda: default_otlp_url(os.environ))
    resource: dict[str, str] = field(default_factory=lambda: {"service.name": "modelplex"})
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay_ms: int = 5000
    bsp_max_export_batch_size: int = 512

    @classmethod
    def parse(cls, items: list[str]) -> TraceConfig:
        config = cls()
        for item in items:
            section, _, setting = item.rpartition(",")
            key, sep, value = setting.partition("=")
            if not sep:
                raise InvalidInput(f"--trace-config {item!r}: expected <setting>=<value>")
            if section not in ("", "opentelemetry"):
                raise InvalidInput(f"--trace-config {item!r}: only the 'opentelemetry' mode is supported")
            config._set(section, key, value, item)
        return config

    def _set(self, section: str, key: str, value: str, item: str) -> None:
        if not section and key == "mode":
            if value != "opentelemetry":
                raise InvalidInput(f"--trace-config {item!r}: only mode=opentelemetry is supported")
        elif not section and key == "level":
            self.level = trace_level([value])
        elif not section and key in ("rate", "count"):
            setattr(self, key, parse_int(value, key, minimum=1 if key == "rate" else -1))
        elif section and key == "url":
            self.url = value
        elif section and key == "resource":
            name, sep, resource_value = value.partition("=")
            if not sep:
                raise InvalidInput(f"--trace-config {item!r}: expected resource=<key>=<value>")
            self.resource[name] = resource_value
        elif section and key in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
            attr = "bsp_schedule_delay_ms" if key == "bsp_schedule_delay" else key
            setattr(self, attr, parse_int(value, key, minimum=1))
        else:
            raise InvalidInput(f"--trace-config {item!r}: unknown setting '{key}'")


def trace_level(values: list) -> str:
    if not values or any(type(v) is not str or v.upper() not in LEVELS for v in values):
        raise InvalidInput(f"trace_level must be a list of {' or '.join(LEVELS)}, got {values!r}")
    levels = {v.upper() for v in values}
    return "TIMESTAMPS" if "TIMESTAMPS" in levels else "OFF"
