"""The HTTP error table: every failure becomes `{"error": "..."}` with the status its type carries."""
from __future__ import annotations

import math

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..core.errors import ModelplexError, Unavailable
from .codec import encode_error

JSON = "application/json"


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(encode_error(message), status, headers, media_type=JSON)


def retry_after(exc: ModelplexError) -> str | None:
    """The Retry-After header value (whole seconds, rounded up) when the error suggests one."""
    if isinstance(exc, Unavailable) and exc.retry_after is not None:
        return str(max(0, math.ceil(exc.retry_after)))
    return None


def modelplex_error(request: Request, exc: ModelplexError) -> Response:
    seconds = retry_after(exc)
    return error_response(exc.status, exc.message, None if seconds is None else {"Retry-After": seconds})


def http_error(request: Request, exc: HTTPException) -> Response:
    """Unknown paths (404) and wrong methods (405) from the router, in the same error shape."""
    return error_response(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", exc.headers)


def unexpected_error(request: Request, exc: Exception) -> Response:
    # Starlette re-raises the exception after this response is sent, so uvicorn logs the traceback.
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


def install_error_handlers(app) -> None:
    app.add_exception_handler(ModelplexError, modelplex_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)
