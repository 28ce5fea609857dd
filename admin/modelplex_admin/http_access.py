"""HTTP side of the access policy: an ASGI middleware in front of every route (the fast infer path too)."""
from __future__ import annotations

import orjson

from modelplex.api_groups import http_group

from .policy import AccessPolicy, Denial


class AccessMiddleware:
    """Refuses a request its group's policy denies, before any route (or body read) runs."""

    def __init__(self, app, policy: AccessPolicy):
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            denial = self.policy.check(http_group(scope["path"]), headers)
            if denial is not None:
                await refuse(send, denial)
                return
        await self.app(scope, receive, send)


async def refuse(send, denial: Denial) -> None:
    body = orjson.dumps({"error": denial.message})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if denial.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="modelplex"'))
    await send({"type": "http.response.start", "status": denial.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

