"""Declares access control and TLS to modelplex: serve flags, access checks for both transports,
HTTPS and gRPC TLS records. Without this plugin the server runs open and in plain text."""
from __future__ import annotations

from modelplex import AccessControl, hookimpl

from .config import OPTIONS, security_config
from .policy import AccessPolicy
from .tls import grpc_tls, http_tls


@hookimpl
def modelplex_serve_options():
    return OPTIONS


@hookimpl
def modelplex_check_settings(settings):
    security_config(settings.plugin_options)


@hookimpl
def modelplex_access_controls(settings):
    security = security_config(settings.plugin_options)
    controls = []
    for transport, restricted in (("http", security.http_restricted), ("grpc", security.grpc_restricted)):
        policy = AccessPolicy(security, restricted, transport)
        if not policy.is_open:  # nothing to check: no per-request cost at all
            controls.append(AccessControl(transport, policy.check))
    return controls


@hookimpl
def modelplex_http_tls(settings):
    return http_tls(security_config(settings.plugin_options))


@hookimpl
def modelplex_grpc_tls(settings):
    return grpc_tls(security_config(settings.plugin_options))
