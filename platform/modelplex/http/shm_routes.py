"""Triton's shared-memory routes (`/v2/systemsharedmemory`, `/v2/cudasharedmemory`): status,
register and unregister, each one call on the data plane's registry (`modelplex.core.shared_memory`)."""
from __future__ import annotations

from fastapi import APIRouter, Request

from ..core.errors import InvalidInput
from ..dataplane import DataPlane
from .routes import json_response, read_json_object

SYSTEM, CUDA = "/v2/systemsharedmemory", "/v2/cudasharedmemory"


def register_arguments(body: dict) -> tuple[str, int, int]:
    """(key, offset, byte_size) of a register request, in Triton's words when one is missing."""
    key = body.get("key")
    if type(key) is not str:
        raise InvalidInput("Shared memory register request has no 'key' field")
    if "byte_size" not in body:
        raise InvalidInput("Shared memory register request has no 'byte_size' field")
    offset, byte_size = body.get("offset", 0), body["byte_size"]
    for what, value in (("offset", offset), ("byte_size", byte_size)):
        if type(value) is not int or value < 0:
            raise InvalidInput(f"Unable to parse '{what}': expected a non-negative integer, got {value!r}")
    return key, offset, byte_size


def create_shm_router(dataplane: DataPlane) -> APIRouter:
    router = APIRouter()
    registry = dataplane.shared_memory
    limit = dataplane.settings.http_max_body_bytes

    @router.get(SYSTEM + "/status")
    @router.get(SYSTEM + "/region/{name}/status")
    async def system_status(name: str = ""):
        return json_response(registry.status(name))

    @router.post(SYSTEM + "/region/{name}/register")
    async def system_register(name: str, request: Request):
        registry.register(name, *register_arguments(await read_json_object(request, limit)))
        return json_response({})

    @router.post(SYSTEM + "/unregister")
    @router.post(SYSTEM + "/region/{name}/unregister")
    async def system_unregister(name: str = ""):
        registry.unregister(name)
        return json_response({})

    @router.get(CUDA + "/status")
    @router.get(CUDA + "/region/{name}/status")
    async def cuda_status(name: str = ""):
        return json_response(registry.cuda_status(name))

    @router.post(CUDA + "/region/{name}/register")
    async def cuda_register(name: str, request: Request):
        await read_json_object(request, limit)  # read (bounded) before refusing
        registry.cuda_register(name)

    @router.post(CUDA + "/unregister")
    @router.post(CUDA + "/region/{name}/unregister")
    async def cuda_unregister(name: str = ""):
        registry.cuda_unregister(name)
        return json_response({})

    return router
