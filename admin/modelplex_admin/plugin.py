"""Declares access control and TLS to modelplex: serve flags, HTTP middleware, gRPC interceptors,
HTTPS and gRPC credentials. Without this plugin the server runs open and in plain text."""
from __future__ import annotations

from modelplex import hookimpl

from .config import OPTIONS, security_config
from .grpc_access import grpc_interceptors
from .http_access import AccessMiddleware
from .policy import AccessPolicy
from .tls import grpc_server_credentials, http_tls


@hookimpl
def modelplex_serve_options():
    return OPTIONS


@hookimpl
def modelplex_check_settings(settings):
    security_config(settings.plugin_options)


@hookimpl
def modelplex_http_middleware(settings):
    security = security_config(settings.plugin_options)
    policy = AccessPolicy(security, security.http_restricted)
    return [] if policy.is_open else [lambda app: AccessMiddleware(app, policy)]


@hookimpl
def modelplex_grpc_interceptors(settings):
    security = security_config(settings.plugin_options)
    return grpc_interceptors(AccessPolicy(security, security.grpc_restricted))


@hookimpl
def modelplex_http_tls(settings):
    return http_tls(security_config(settings.plugin_options))


@hookimpl
def modelplex_grpc_credentials(settings):
    return grpc_server_credentials(security_config(settings.plugin_options))
