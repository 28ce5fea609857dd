"""`--access-log` for gRPC: one line per call (method, model, status, latency, request id) on the
`modelplex.access` logger; a stream is one line, when it ends."""
from __future__ import annotations

import logging
import time

import grpc

log = logging.getLogger("modelplex.access")


def _line(method: str, request, context, start: float, failed: bool) -> None:
    code = None
    try:
        code = context.code()
    except Exception:  # a context that cannot say: the outcome decides
        pass
    status = getattr(code, "name", None) or ("UNKNOWN" if failed else "OK")
    model = getattr(request, "model_name", "") or getattr(request, "name", "") or "-"
    log.info("gRPC %s model=%s status=%s latency_ms=%.2f request_id=%s", method, model, status,
             (time.perf_counter() - start) * 1000, getattr(request, "id", "") or "-")


class AccessLogInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request, context):
                start, failed = time.perf_counter(), True
                try:
                    response = await inner(request, context)
                    failed = False
                    return response
                finally:
                    _line(method, request, context, start, failed)

            return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer,
                                                       handler.response_serializer)
        if handler.stream_stream is not None:
            inner_stream = handler.stream_stream

            async def stream(request_iterator, context):
                start, failed = time.perf_counter(), True
                try:
                    async for response in inner_stream(request_iterator, context):
                        yield response
                    failed = False
                finally:
                    _line(method, None, context, start, failed)

            return grpc.stream_stream_rpc_method_handler(stream, handler.request_deserializer,
                                                         handler.response_serializer)
        return handler
