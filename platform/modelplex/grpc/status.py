"""The one table from the data plane's typed errors to gRPC status codes, applied to every RPC."""
from __future__ import annotations

import functools
import logging
import math

import grpc

from ..core.errors import ModelplexError, Overloaded, Unavailable

log = logging.getLogger(__name__)

# Keyed by `ModelplexError.status` so subclasses of a typed error map like their parent.
STATUS_TO_CODE = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


def status_code(error: ModelplexError) -> grpc.StatusCode:
    if isinstance(error, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return STATUS_TO_CODE.get(error.status, grpc.StatusCode.INTERNAL)


def pushback(error: ModelplexError) -> tuple[tuple[str, str], ...]:
    """gRPC's retry pushback (what HTTP's Retry-After says) when an Unavailable error suggests a wait."""
    if isinstance(error, Unavailable) and error.retry_after is not None:
        return (("grpc-retry-pushback-ms", str(max(0, math.ceil(error.retry_after * 1000)))),)
    return ()


def error_message(error: Exception) -> str:
    """What a client reads for `error`; unexpected exceptions are logged here, once."""
    if isinstance(error, ModelplexError):
        return error.message
    log.error("unexpected error in a gRPC call", exc_info=error)
    return f"internal error: {type(error).__name__}: {error}"


def guarded(method):
    """Wrap a unary `async def Rpc(self, request, context)` so typed errors end the call with their code."""

    @functools.wraps(method)
    async def call(self, request, context):
        try:
            return await method(self, request, context)
        except ModelplexError as e:
            await context.abort(status_code(e), e.message, pushback(e))
        except Exception as e:
            await context.abort(grpc.StatusCode.INTERNAL, error_message(e))

    return call
