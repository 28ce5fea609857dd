"""gRPC side of the access policy: a server interceptor over every method, streams included."""
from __future__ import annotations

import grpc

from .policy import AccessPolicy, Denial, grpc_group

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
        return refusing_handler(handler, denial)


def refusing_handler(handler: grpc.RpcMethodHandler, denial: Denial) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that ends the call with the denial's status."""
    code = CODES[denial.status]

    async def unary(request, context):
        await context.abort(code, denial.message)

    async def streaming(request, context):
        await context.abort(code, denial.message)
        yield  # makes this an async generator, as streaming handlers are

    codec = {"request_deserializer": handler.request_deserializer,
             "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming, **codec)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, **codec)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming, **codec)
    return grpc.unary_unary_rpc_method_handler(unary, **codec)


def grpc_interceptors(policy: AccessPolicy) -> list[grpc.aio.ServerInterceptor]:
    return [] if policy.is_open else [AccessInterceptor(policy)]
