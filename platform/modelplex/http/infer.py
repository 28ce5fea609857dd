"""`POST /v2/models/{m}[/versions/{v}]/infer` as a bare ASGI handler: the hot path.

It skips FastAPI's middleware stack and Starlette's request objects and speaks ASGI messages
directly (in-process, a `simple` request costs ~42 us this way and ~75 us as a FastAPI route);
errors still go through the same `{"error": ...}` table as every other route.
"""
from __future__ import annotations

import logging
import re

from ..core.errors import ModelplexError
from ..core.settings import ServerConfig
from ..dataplane import DataPlane
from ..observability.trace_spans import STATUS_ERROR, STATUS_UNSET, share
from ..observability.tracing import Tracing
from .body import ClientGone, compress, parse_length, read_body, response_encoding
from .codec import decode_request, encode_error, encode_response
from .errors import retry_after
from .forwarding import HeaderForwarding
from .raw import decode_raw_request

log = logging.getLogger(__name__)

INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
_JSON_HEADERS = [(b"content-type", b"application/json")]
_BINARY_TYPE = (b"content-type", b"application/octet-stream")
_WANTED = {b"content-length", b"content-encoding", b"accept-encoding", b"inference-header-content-length"}
_MAX_SHARED_SPAN_FIELDS = 1024


class InferEndpoint:
    def __init__(self, dataplane: DataPlane, settings: ServerConfig):
        self.dataplane = dataplane
        self.max_body_bytes = settings.http_max_body_bytes
        self.limits = settings.tensor_limits
        self.forward = HeaderForwarding.of(settings.http_header_forward_pattern)
        self._span_fields: dict[str, tuple[str, dict, dict]] = {}

    async def __call__(self, scope, receive, send, model: str, version: str | None) -> int | None:
        """Answers the request; returns the status sent (None: the client went away first)."""
        headers = {k: v.decode("latin-1") for k, v in scope["headers"] if k in _WANTED}
        memory, held = self.dataplane.request_memory, [0]  # bytes held from before the read until the answer is sent
        try:
            try:
                length = headers.get(b"content-length")
                if length is not None:
                    self._hold(held, min(parse_length(length, "Content-Length"), self.max_body_bytes + 1))
                body = await read_body(receive, length, headers.get(b"content-encoding"), self.max_body_bytes)
                self._hold(held, len(body) - held[0])  # chunked, or decompressed
                forwarded = self.forward.parameters(scope["headers"]) if self.forward is not None else None
                response_headers, payload = await self._infer(body, headers, model, version or "", forwarded)
                status = 200
            except ClientGone:
                return None
            except ModelplexError as e:
                status, response_headers, payload = e.status, list(_JSON_HEADERS), encode_error(e.message)
                seconds = retry_after(e)
                if seconds is not None:
                    response_headers.append((b"retry-after", seconds.encode()))
            except Exception as e:
                log.exception("infer on model %s failed", model)
                status, response_headers, payload = 500, list(_JSON_HEADERS), encode_error(f"internal error: {e}")
            await respond(send, status, response_headers, payload)
            return status
        finally:
            memory.release(held[0])

    def _hold(self, held: list[int], more: int) -> None:
        if more > 0:
            self.dataplane.request_memory.reserve(more)
            held[0] += more

    async def traced(self, tracing: Tracing, scope, receive, send, model: str, version: str | None) -> None:
        """`__call__` inside the server span of a sampled request."""
        fields = self._span_fields.get(scope["path"]) or self._new_span_fields(scope["path"], model)
        span = tracing.request_span(fields[0], fields[1], scope["headers"])
        span.__enter__()  # what `with span:` does, with `close` at the end: one call each way
        status = None
        try:
            status = await self(scope, receive, send, model, version)
        finally:  # `self` answers every error itself; a cancelled request's span ends without a status
            if status == 200:
                span.close(fields[2], STATUS_UNSET)
            elif status is None:
                span.close(None, STATUS_UNSET)
            else:
                span.close({**fields[1], "http.response.status_code": status},
                           STATUS_ERROR if status >= 500 else STATUS_UNSET)

    def _new_span_fields(self, path: str, model: str) -> tuple[str, dict, dict]:
        """A path's server span name, attributes, and attributes once answered 200. Shared by every
        request on the path (never changed): nothing is built per request, and spans record them by
        reference (`share`). At most `_MAX_SHARED_SPAN_FIELDS` paths: clients choose them."""
        attributes = {"http.request.method": "POST", "url.path": path, "model": model}
        fields = (f"POST {path}", attributes, {**attributes, "http.response.status_code": 200})
        if len(self._span_fields) < _MAX_SHARED_SPAN_FIELDS:
            for field in fields:
                share(field)
            self._span_fields[path] = fields
        return fields

    async def refuse_method(self, scope, send) -> None:
        payload = encode_error(f"Method Not Allowed: {scope['method']} {scope['path']}")
        await respond(send, 405, [*_JSON_HEADERS, (b"allow", b"POST")], payload)

    async def _infer(self, body: bytearray, headers: dict, model: str, version: str,
                     forwarded: dict | None) -> tuple[list, bytes]:
        header_length = headers.get(b"inference-header-content-length")
        if header_length is not None:
            header_length = parse_length(header_length, "Inference-Header-Content-Length")
        self.dataplane.check_model(model, version)  # an unknown model is a 404 whatever the body
        if header_length == 0:  # Triton's raw binary request: the body is the one input's bytes
            config = self.dataplane.model_config(model, version)
            request, fmt = decode_raw_request(body, config, model, version, self.limits)
        else:
            request, fmt = decode_request(body, header_length, model, version, self.limits)
        if forwarded:
            request.parameters.update(forwarded)
        response = await self.dataplane.infer(request)
        payload, json_length = encode_response(response, fmt)
        if json_length is None:
            response_headers = list(_JSON_HEADERS)
        else:
            response_headers = [_BINARY_TYPE, (b"inference-header-content-length", str(json_length).encode())]
        encoding = response_encoding(headers.get(b"accept-encoding"))
        if encoding is not None:
            payload = compress(payload, encoding)
            response_headers.append((b"content-encoding", encoding.encode()))
        return response_headers, payload


async def respond(send, status: int, headers: list, payload: bytes) -> None:
    headers.append((b"content-length", str(len(payload)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
