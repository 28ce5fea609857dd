"""Plugins' access checks (`modelplex_access_controls`) on HTTP: an ASGI middleware in front of every
route, the fast infer path included, that refuses before any route runs or any body is read."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import orjson

from ..core.api_groups import http_group
from ..core.extensions import Denial

Check = Callable[[str, Mapping[str, str]], Denial | None]


class AccessMiddleware:
    def __init__(self, app, checks: list[Check]):
        self.app, self.checks = app, checks

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            group = http_group(scope["path"])
            for check in self.checks:
                denial = check(group, headers)
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
