"""The server span of a sampled HTTP request: around the whole exchange, streamed bodies included."""
from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from ..observability.trace_spans import STATUS_ERROR
from ..observability.tracing import Tracing

# Traced besides infer: the generate extension and the OpenAI routes (their model is in the body,
# read later: they are sampled by the global settings, "").
_GENERATE_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/[^/]+)?/generate(?:_stream)?")
_OPENAI_PATHS = frozenset(("/v1/completions", "/v1/chat/completions", "/v1/embeddings"))


def traced_route_model(path: str) -> str | None:
    """The model a traced route serves ("" when only the body names it); None: not traced."""
    match = _GENERATE_PATH.fullmatch(path)
    if match is not None:
        return match[1]
    return "" if path in _OPENAI_PATHS else None


async def traced(tracing: Tracing, scope, send, model: str, handler: Callable[[Callable], Awaitable]) -> None:
    """Runs `handler(send)` inside the request's server span (child of the client's `traceparent`)."""
    attributes = {"http.request.method": scope["method"], "url.path": scope["path"]}
    if model:
        attributes["model"] = model
    with tracing.request_span(f"{scope['method']} {scope['path']}", attributes, scope["headers"]) as span:
        async def send_recording_status(message) -> None:
            if message["type"] == "http.response.start":
                span.set_attribute("http.response.status_code", message["status"])
                if message["status"] >= 500:
                    span.set_status(STATUS_ERROR)
            await send(message)

        await handler(send_recording_status)
