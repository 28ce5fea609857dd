"""gRPC side of the access policy: a server interceptor over every method, streams included."""
from __future__ import annotations

import grpc
from modelplex.api_groups import grpc_group
from modelplex.grpc.refusal import refusing_handler

from .policy import AccessPolicy

CODES = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED}


class AccessInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, policy: AccessPolicy):
        self.policy = policy

    async def intercept_service(self, continuation, details):
        headers = {}
        for key, value in details.invocation_metadata or ():
            if isinstance(value, str):  # binary (-bin) metadata is never a credential
                headers[key.lower()] = value
        denial = self.policy.check(grpc_group(details.method), headers)
        handler = await continuation(details)
        if denial is None or handler is None:
            return handler
        return refusing_handler(handler, CODES[denial.status], denial.message)


def grpc_interceptors(policy: AccessPolicy) -> list[grpc.aio.ServerInterceptor]:
    return [] if policy.is_open else [AccessInterceptor(policy)]
