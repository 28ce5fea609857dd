"""Typed errors of the data plane; each transport maps `status` to its own codes."""
from __future__ import annotations


class ModelplexError(Exception):
    """Base of every error a client may see. `status` is the HTTP status it maps to."""

    status = 500

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        # The request field (or flag, or parameter) the error is about, when there is one: the OpenAI
        # door reports it as the error object's `param`.
        self.param = param


class InvalidInput(ModelplexError):
    status = 400


class NotFound(ModelplexError):
    status = 404


class Unavailable(ModelplexError):
    """The model or server cannot take the request now (not ready, draining, queue full)."""

    status = 503

    def __init__(self, message: str, retry_after: float | None = None, param: str | None = None):
        super().__init__(message, param)
        self.retry_after = retry_after


class Overloaded(Unavailable):
    """The server is out of a resource shared by all requests (memory for request bodies): HTTP 503,
    gRPC RESOURCE_EXHAUSTED."""


class Unsupported(ModelplexError):
    status = 501


class InternalError(ModelplexError):
    status = 500
