"""TLS for both listeners, from `SecurityConfig`: uvicorn's ssl arguments and gRPC server credentials."""
from __future__ import annotations

import ssl

import grpc

from modelplex.settings import SecurityConfig


def uvicorn_ssl_options(security: SecurityConfig) -> dict:
    """Keyword arguments for `uvicorn.Config`: none without a certificate; client certificates
    required when a root certificate is given."""
    if security.http_server_cert is None:
        return {}
    options = {"ssl_certfile": str(security.http_server_cert), "ssl_keyfile": str(security.http_server_key)}
    if security.http_root_cert is not None:
        options |= {"ssl_ca_certs": str(security.http_root_cert), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return options


def grpc_server_credentials(security: SecurityConfig) -> grpc.ServerCredentials | None:
    """Triton's --grpc-use-ssl / --grpc-use-ssl-mutual; None means an insecure port."""
    if security.grpc_server_cert is None:
        return None
    root = security.grpc_root_cert.read_bytes() if security.grpc_root_cert is not None else None
    return grpc.ssl_server_credentials(
        [(security.grpc_server_key.read_bytes(), security.grpc_server_cert.read_bytes())],
        root_certificates=root, require_client_auth=security.grpc_use_ssl_mutual)
