"""The separate admin address (`--admin-http-port`, `--admin-grpc-port`): model-control groups
(`api_groups.ADMIN_GROUPS`) answer only there, and the admin listeners answer nothing else but health.

Both listeners serve the same app / servicer; these wrappers only refuse what a port does not serve,
before any route runs or any body is read.
"""
from __future__ import annotations

import grpc
import orjson

from ..core.api_groups import ADMIN_GROUPS, grpc_group, http_group
from ..grpc.refusal import refusing_handler


def _served(group: str, is_admin_port: bool) -> bool:
    return group == "health" or (group in ADMIN_GROUPS) == is_admin_port


def _refusal(is_admin_port: bool) -> str:
    return ("the admin port serves only model-control APIs and health" if is_admin_port
            else "model-control APIs are served on the admin port only")


class AdminSplitMiddleware:
    """ASGI: a route of a group this port does not serve is a 404 naming where it is served."""

    def __init__(self, app, is_admin_port: bool):
        self.app, self.is_admin_port = app, is_admin_port
        self._body = orjson.dumps({"error": _refusal(is_admin_port)})

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            group = http_group(scope["path"])
            if not _served(group, self.is_admin_port):
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(self._body)).encode())]
                await send({"type": "http.response.start", "status": 404, "headers": headers})
                await send({"type": "http.response.body", "body": self._body})
                return
        await self.app(scope, receive, send)


class AdminSplitInterceptor(grpc.aio.ServerInterceptor):
    """gRPC: a method of a group this port does not serve ends UNIMPLEMENTED."""

    def __init__(self, is_admin_port: bool):
        self.is_admin_port = is_admin_port

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        group = grpc_group(details.method)
        if handler is None or _served(group, self.is_admin_port):
            return handler
        return refusing_handler(handler, grpc.StatusCode.UNIMPLEMENTED, _refusal(self.is_admin_port))
