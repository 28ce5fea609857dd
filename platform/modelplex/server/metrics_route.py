"""`GET /metrics` on the HTTP port (vLLM serves it there): the same page as the metrics port's."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from ..observability.metrics import MetricsPage


def metrics_router(page: MetricsPage) -> APIRouter:
    router = APIRouter()

    @router.get("/metrics", include_in_schema=False)
    async def metrics():
        text = await asyncio.to_thread(page.render)  # collectors read engine stats: never on the event loop
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    return router
