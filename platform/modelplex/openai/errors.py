"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the matching status.

Data-plane errors keep their status, except a full queue (Unavailable with a retry hint), which
OpenAI clients expect as 429 with Retry-After. An error's `param` (the request field a backend or
the host named when it raised it) becomes the error object's `param`.
"""
from __future__ import annotations

import logging
import math

import orjson
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.responses import Response

from ..core.errors import ModelplexError, NotFound, Unavailable
from ..http.body import ClientGone
from ..http.sse import CLIENT_CLOSED

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 501: "not_implemented_error",
          503: "service_unavailable_error"}


class RequestError(ModelplexError):
    """A bad request field, named in `param`."""

    status = 400

    def __init__(self, param: str | None, message: str):
        super().__init__(message, param)


def error_object(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


def with_param(exc: ModelplexError, aliases: dict[str, str]) -> ModelplexError:
    """A backend's 400 about one of its fields as a RequestError naming the request's field (the
    OpenAI spelling, e.g. `max_completion_tokens` for the protocol's `max_tokens`)."""
    if exc.status != 400 or exc.param is None or isinstance(exc, RequestError):
        return exc
    param = aliases.get(exc.param, exc.param)
    message = exc.message
    if message.startswith(exc.param + ": "):  # "max_tokens: ..." names the field the client sent
        message = param + message[len(exc.param):]
    return RequestError(param, message)


def describe(exc: BaseException) -> tuple[int, dict, dict]:
    """(status, error object, headers) for any exception a route may raise."""
    headers = {}
    if isinstance(exc, RequestError):
        return 400, error_object(400, exc.message, exc.param), headers
    if isinstance(exc, ValidationError):
        return 400, _validation_error(exc), headers
    if not isinstance(exc, ModelplexError):
        log.error("OpenAI route failed", exc_info=exc)
        return 500, error_object(500, f"internal error: {type(exc).__name__}: {exc}"), headers
    status, param, code = exc.status, exc.param if exc.status == 400 else None, None
    if isinstance(exc, Unavailable) and exc.retry_after is not None:
        status, code = 429, "rate_limit_exceeded"
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    elif isinstance(exc, NotFound):
        code = "model_not_found"
    return status, error_object(status, exc.message, param, code), headers


def _validation_error(exc: ValidationError) -> dict:
    first = exc.errors()[0]
    # The top-level field only: deeper locations name pydantic's union members ("prompt.list[str].0").
    param = str(first["loc"][0]) if first["loc"] else None
    if first["type"] == "extra_forbidden":
        return error_object(400, f"Unrecognized request argument supplied: {param}", param)
    return error_object(400, f"{param}: {first['msg']}", param)


def error_response(exc: BaseException) -> Response:
    status, body, headers = describe(exc)
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


class OpenAIRoute(APIRoute):
    """Routes whose every failure is answered in OpenAI's error shape (not the v2 `{"error": "..."}`)."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def guarded(request):
            try:
                return await handler(request)
            except ClientGone:
                return Response(status_code=CLIENT_CLOSED)
            except Exception as exc:
                return error_response(exc)

        return guarded
