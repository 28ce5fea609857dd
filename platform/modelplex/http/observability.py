"""Triton's run-time settings routes: `/v2/trace/setting`, `/v2/models/{m}/trace/setting`, `/v2/logging`."""
from __future__ import annotations

from fastapi import APIRouter, Request

from ..core.errors import NotFound
from ..dataplane import DataPlane
from ..observability.logs import LOG_SETTINGS
from .routes import json_response, read_json_object

MAX_SETTINGS_BYTES = 64 * 1024


def create_observability_router(dataplane: DataPlane) -> APIRouter:
    router = APIRouter()
    tracing = dataplane.tracing

    def known_model(model: str) -> str:
        if not any(row["name"] == model for row in dataplane.repository_index()):
            raise NotFound(f"model '{model}' is not in the model repository")
        return model

    @router.get("/v2/trace/setting")
    async def get_trace_setting():
        return json_response(tracing.settings())

    @router.post("/v2/trace/setting")
    async def update_trace_setting(request: Request):
        return json_response(tracing.update(await read_json_object(request, MAX_SETTINGS_BYTES)))

    @router.get("/v2/models/{model}/trace/setting")
    async def get_model_trace_setting(model: str):
        return json_response(tracing.settings(known_model(model)))

    @router.post("/v2/models/{model}/trace/setting")
    async def update_model_trace_setting(model: str, request: Request):
        changes = await read_json_object(request, MAX_SETTINGS_BYTES)
        return json_response(tracing.update(changes, known_model(model)))

    @router.get("/v2/logging")
    async def get_logging():
        return json_response(LOG_SETTINGS.settings())

    @router.post("/v2/logging")
    async def update_logging(request: Request):
        return json_response(LOG_SETTINGS.update(await read_json_object(request, MAX_SETTINGS_BYTES)))

    return router
