"""Assembles the OpenAI-compatible router: /v1/models, the completion, embedding, Responses and LoRA
routes, and vLLM's utility routes (health, ping, version, tokenize, detokenize)."""
from __future__ import annotations

import time

from fastapi import APIRouter

from ..core.errors import NotFound
from ..dataplane import DataPlane
from ..http.routes import json_response
from . import completions, embeddings, lora, responses_route, utility_routes
from .completions import RouteContext
from .errors import OpenAIRoute
from .fields import FieldPolicy
from .models import is_llm, listed_adapters, listed_models, max_model_len


def create_openai_router(dataplane: DataPlane) -> APIRouter:
    router = APIRouter(route_class=OpenAIRoute)
    ctx = RouteContext(dataplane, dataplane.settings.http_max_body_bytes,
                       FieldPolicy(dataplane.settings.openai_strict_fields))
    created = int(time.time())

    def card(name: str, parent: str | None = None, context: int | None = None) -> dict:
        # vLLM's card: a LoRA adapter is a model whose `parent` is its base model.
        return {"id": name, "object": "model", "created": created, "owned_by": "modelplex", "root": name,
                "parent": parent, "max_model_len": context}

    def cards() -> list[dict]:
        models = listed_models(dataplane)
        lengths = {m: max_model_len(dataplane, m) if is_llm(dataplane, m) else None for m in models}
        return [card(name, None, lengths[name]) for name in models] + [
            card(a, m, lengths.get(m)) for a, m in listed_adapters(dataplane, models)]

    @router.get("/v1/models")
    async def models():
        return json_response({"object": "list", "data": cards()})

    @router.get("/v1/models/{model:path}")
    async def model(model: str):
        for found in cards():
            if found["id"] == model:
                return json_response(found)
        raise NotFound(f"model '{model}' is not found")

    completions.add_routes(router, ctx)
    embeddings.add_routes(router, ctx)
    responses_route.add_routes(router, ctx)
    lora.add_routes(router, ctx)
    utility_routes.add_routes(router, ctx)
    return router
