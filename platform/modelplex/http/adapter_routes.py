"""LoRA adapter routes of the repository API: list, load and unload a model's adapters.

`POST /v2/repository/models/{m}/adapters/{a}/load` takes `{"parameters": {"source": "/abs/folder"}}`
(no source: the model's `adapters/{a}/` folder), as `modelplex adapters load` sends it. These
routes are mounted before the model load route, whose `{name:path}` would otherwise take them.
"""
from __future__ import annotations

from fastapi import APIRouter, Request

from ..core.errors import InvalidInput
from ..dataplane import DataPlane
from .routes import json_response, parameters_of, read_json_object


def create_adapter_router(dataplane: DataPlane) -> APIRouter:
    router = APIRouter()
    limit = dataplane.settings.http_max_body_bytes

    @router.get("/v2/repository/models/{model}/adapters")
    async def list_adapters(model: str):
        return json_response(dataplane.list_adapters(model))

    # `{adapter:path}` so that a name holding '/' reaches the name check (400) instead of a 404.
    @router.post("/v2/repository/models/{model}/adapters/{adapter:path}/load")
    async def load(model: str, adapter: str, request: Request):
        parameters = parameters_of(await read_json_object(request, limit))
        unknown = set(parameters) - {"source"}
        if unknown:
            raise InvalidInput(f"unknown adapter load parameter '{sorted(unknown)[0]}' (expected 'source')")
        await dataplane.load_adapter(model, adapter, parameters.get("source"))
        return json_response({})

    @router.post("/v2/repository/models/{model}/adapters/{adapter:path}/unload")
    async def unload(model: str, adapter: str, request: Request):
        if parameters_of(await read_json_object(request, limit)):
            raise InvalidInput("adapter unload takes no parameters")
        await dataplane.unload_adapter(model, adapter)
        return json_response({})

    return router
