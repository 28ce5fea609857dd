"""`--access-log` for HTTP: one line per request (method, path, model, status, latency, request id) on the
`modelplex.access` logger, so it follows `--log-format`."""
from __future__ import annotations

import logging
import re
import time

from ..observability.logs import current_request, request_id_of

log = logging.getLogger("modelplex.access")
_MODEL = re.compile(r"/v2/(?:repository/)?models/([^/]+)")


class AccessLogMiddleware:
    """Outermost ASGI wrapper: sees every answer, refusals of access checks included. The request id is
    the data plane's (the client's `id`, else one it made), or an `x-request-id` header, or `-`."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [0]

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = scope["path"]
            match = _MODEL.match(path)
            request = current_request.get()
            request_id = (request_id_of(request) if request is not None
                          else dict(scope["headers"]).get(b"x-request-id", b"-").decode("latin-1"))
            log.info("%s %s model=%s status=%s latency_ms=%.2f request_id=%s", scope["method"], path,
                     match[1] if match else "-", status[0] or "-", (time.perf_counter() - start) * 1000, request_id)
