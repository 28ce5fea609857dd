"""Plugins' access checks (`modelplex_access_controls`) on gRPC: a server interceptor over every
method, streams included, and the TLS record (`GrpcTls`) as server credentials."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import grpc

from ..core.api_groups import grpc_group
from ..core.extensions import Denial, GrpcTls
from .refusal import refusing_handler

Check = Callable[[str, Mapping[str, str]], Denial | None]
CODES = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED}


class AccessInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, checks: list[Check]):
        self.checks = checks

    async def intercept_service(self, continuation, details):
        headers = {}
        for key, value in details.invocation_metadata or ():
            if isinstance(value, str):  # binary (-bin) metadata is never a credential
                headers[key.lower()] = value
        group = grpc_group(details.method)
        denial = next((d for d in (check(group, headers) for check in self.checks) if d is not None), None)
        handler = await continuation(details)
        if denial is None or handler is None:
            return handler
        return refusing_handler(handler, CODES.get(denial.status, grpc.StatusCode.PERMISSION_DENIED), denial.message)


def server_credentials(tls: GrpcTls) -> grpc.ServerCredentials:
    """Triton's --grpc-use-ssl / --grpc-use-ssl-mutual as gRPC server credentials."""
    root = tls.root_cert.read_bytes() if tls.root_cert is not None else None
    return grpc.ssl_server_credentials([(tls.keyfile.read_bytes(), tls.certfile.read_bytes())],
                                       root_certificates=root, require_client_auth=tls.mutual)
