"""Assembles the OpenAI-compatible router: /v1/models plus the completion and embedding routes."""
from __future__ import annotations

import time

from fastapi import APIRouter

from ..core.errors import NotFound
from ..dataplane import DataPlane
from ..http.routes import json_response
from . import completions, embeddings, lora
from .errors import OpenAIRoute
from .models import listed_adapters, listed_models


def create_openai_router(dataplane: DataPlane) -> APIRouter:
    router = APIRouter(route_class=OpenAIRoute)
    limit = dataplane.settings.http_max_body_bytes
    created = int(time.time())

    def card(name: str, parent: str | None = None) -> dict:
        # vLLM's card: a LoRA adapter is a model whose `parent` is its base model.
        return {"id": name, "object": "model", "created": created, "owned_by": "modelplex", "root": name,
                "parent": parent}

    def cards() -> list[dict]:
        models = listed_models(dataplane)
        return [card(name) for name in models] + [card(a, m) for a, m in listed_adapters(dataplane, models)]

    @router.get("/v1/models")
    async def models():
        return json_response({"object": "list", "data": cards()})

    @router.get("/v1/models/{model:path}")
    async def model(model: str):
        for found in cards():
            if found["id"] == model:
                return json_response(found)
        raise NotFound(f"model '{model}' is not found")

    completions.add_routes(router, dataplane, limit)
    embeddings.add_routes(router, dataplane, limit)
    lora.add_routes(router, dataplane, limit)
    return router
