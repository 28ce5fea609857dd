"""The flags this plugin adds to `modelplex serve` and the `SecurityConfig` they make."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelplex import ServeOption, parse_bool

GROUP = "TLS and access control (modelplex_admin)"
OPTIONS = [ServeOption(flags, help, group=GROUP, **kw) for flags, help, kw in [
    (("--admin-token",), "bearer token for model-control APIs (model-repository, trace, logging); repeatable",
     {"action": "append", "default": []}),
    (("--admin-token-file",), "a file holding the admin token (e.g. a mounted Secret)", {"type": Path}),
    (("--api-key",), "bearer key required for inference; repeatable", {"action": "append", "default": []}),
    (("--api-key-file",), "a file with one inference API key per line", {"type": Path}),
    (("--http-restricted-api",), "requests to these API groups must carry header <key> with <value> (Triton's flag)",
     {"action": "append", "default": [], "metavar": "<api-groups>:<key>=<value>"}),
    (("--grpc-restricted-protocol",), "gRPC calls of these API groups must carry metadata "
     "triton-grpc-protocol-<key> (or <key>) with <value> (Triton's flag)",
     {"action": "append", "default": [], "metavar": "<api-groups>:<key>=<value>"}),
    (("--http-server-cert",), "PEM certificate: serve HTTPS", {"type": Path}),
    (("--http-server-key",), "PEM key of --http-server-cert", {"type": Path}),
    (("--http-root-cert",), "PEM CA: HTTPS clients must present a certificate it signed", {"type": Path}),
    (("--grpc-use-ssl",), "serve gRPC over TLS (needs --grpc-server-cert/--grpc-server-key)",
     {"type": parse_bool, "default": False}),
    (("--grpc-use-ssl-mutual",), "gRPC clients must present a certificate --grpc-root-cert signed",
     {"type": parse_bool, "default": False}),
    (("--grpc-server-cert",), "PEM certificate of the gRPC port", {"type": Path}),
    (("--grpc-server-key",), "PEM key of --grpc-server-cert", {"type": Path}),
    (("--grpc-root-cert",), "PEM CA for client certificates (--grpc-use-ssl-mutual)", {"type": Path}),
]]


@dataclass
class SecurityConfig:
    """TLS and access control. Empty values mean "off"."""

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


def _secrets(values: list[str], path: Path | None) -> list[str]:
    if path is not None:
        values = values + [line.strip() for line in path.read_text().splitlines() if line.strip()]
    return values


def security_config(options: Mapping[str, Any]) -> SecurityConfig:
    """The flags' values as a `SecurityConfig`; raises ValueError on contradictions or unreadable files."""
    from .policy import parse_restrictions

    o = {option.dest: option.default for option in OPTIONS} | dict(options)
    try:
        http_restricted = parse_restrictions(o["http_restricted_api"], "--http-restricted-api")
        grpc_restricted = parse_restrictions(o["grpc_restricted_protocol"], "--grpc-restricted-protocol")
        admin_tokens = _secrets(o["admin_token"], o["admin_token_file"])
        api_keys = _secrets(o["api_key"], o["api_key_file"])
    except OSError as e:
        raise ValueError(str(e)) from None
    if (o["http_server_cert"] is None) != (o["http_server_key"] is None):
        raise ValueError("--http-server-cert and --http-server-key go together")
    if o["http_root_cert"] is not None and o["http_server_cert"] is None:
        raise ValueError("--http-root-cert needs --http-server-cert and --http-server-key")
    use_ssl = o["grpc_use_ssl"] or o["grpc_use_ssl_mutual"]
    if use_ssl and (o["grpc_server_cert"] is None or o["grpc_server_key"] is None):
        raise ValueError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if o["grpc_use_ssl_mutual"] and o["grpc_root_cert"] is None:
        raise ValueError("--grpc-use-ssl-mutual needs --grpc-root-cert")
    return SecurityConfig(
        admin_tokens=admin_tokens, api_keys=api_keys, http_restricted=http_restricted,
        grpc_restricted=grpc_restricted, http_server_cert=o["http_server_cert"],
        http_server_key=o["http_server_key"], http_root_cert=o["http_root_cert"],
        grpc_server_cert=o["grpc_server_cert"] if use_ssl else None,
        grpc_server_key=o["grpc_server_key"] if use_ssl else None,
        grpc_root_cert=o["grpc_root_cert"] if use_ssl else None, grpc_use_ssl_mutual=o["grpc_use_ssl_mutual"])
