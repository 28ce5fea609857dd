"""Assembles the OpenAI-compatible router: /v1/models plus the completion and embedding routes."""
from __future__ import annotations

import time

from fastapi import APIRouter

from ..dataplane import DataPlane
from ..errors import NotFound
from ..http.routes import json_response
from . import completions, embeddings
from .errors import OpenAIRoute
from .models import listed_models


def create_openai_router(dataplane: DataPlane) -> APIRouter:
    router = APIRouter(route_class=OpenAIRoute)
    limit = dataplane.settings.http_max_body_bytes
    created = int(time.time())

    def card(name: str) -> dict:
        return {"id": name, "object": "model", "created": created, "owned_by": "modelplex"}

    @router.get("/v1/models")
    async def models():
        return json_response({"object": "list", "data": [card(name) for name in listed_models(dataplane)]})

    @router.get("/v1/models/{model:path}")
    async def model(model: str):
        if model not in listed_models(dataplane):
            raise NotFound(f"model '{model}' is not found")
        return json_response(card(model))

    completions.add_routes(router, dataplane, limit)
    embeddings.add_routes(router, dataplane, limit)
    return router
