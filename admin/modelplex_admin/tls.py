"""TLS for both listeners, from `SecurityConfig`, as the records the host applies."""
from __future__ import annotations

from modelplex import GrpcTls, HttpTls

from .config import SecurityConfig


def http_tls(security: SecurityConfig) -> HttpTls | None:
    """None without a certificate; client certificates required when a root certificate is given."""
    if security.http_server_cert is None:
        return None
    return HttpTls(security.http_server_cert, security.http_server_key, security.http_root_cert)


def grpc_tls(security: SecurityConfig) -> GrpcTls | None:
    """Triton's --grpc-use-ssl / --grpc-use-ssl-mutual; None means an insecure port."""
    if security.grpc_server_cert is None:
        return None
    return GrpcTls(security.grpc_server_cert, security.grpc_server_key, security.grpc_root_cert,
                   security.grpc_use_ssl_mutual)
