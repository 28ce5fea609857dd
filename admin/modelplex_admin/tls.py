"""TLS for both listeners, from `SecurityConfig`: the HTTPS record and gRPC server credentials."""
from __future__ import annotations

import grpc
from modelplex.extensions import HttpTls

from .config import SecurityConfig


def http_tls(security: SecurityConfig) -> HttpTls | None:
    """None without a certificate; client certificates required when a root certificate is given."""
    if security.http_server_cert is None:
        return None
    return HttpTls(security.http_server_cert, security.http_server_key, security.http_root_cert)


def grpc_server_credentials(security: SecurityConfig) -> grpc.ServerCredentials | None:
    """Triton's --grpc-use-ssl / --grpc-use-ssl-mutual; None means an insecure port."""
    if security.grpc_server_cert is None:
        return None
    root = security.grpc_root_cert.read_bytes() if security.grpc_root_cert is not None else None
    return grpc.ssl_server_credentials(
        [(security.grpc_server_key.read_bytes(), security.grpc_server_cert.read_bytes())],
        root_certificates=root, require_client_auth=security.grpc_use_ssl_mutual)
