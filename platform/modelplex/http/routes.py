"""Every KServe v2 / Triton HTTP route except infer: health, metadata, config, statistics, repository.

Each route only translates between HTTP and one `DataPlane` call; errors propagate as typed
exceptions to the table in `errors.py`.
"""
from __future__ import annotations

import base64
import binascii

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from ..core.errors import InvalidInput
from ..core.settings import ServerConfig
from ..dataplane import DataPlane
from ..models import config as model_config
from .body import read_body
from .errors import JSON, error_response

FILE_PREFIX = "file:"


def json_response(data) -> Response:
    return Response(orjson.dumps(data), media_type=JSON)


def status_response(ok: bool, what: str) -> Response:
    """Triton's health answers: 200 with no body, or 400 (tritonclient only looks at the code)."""
    return Response(status_code=200) if ok else error_response(400, f"{what} is not ready")


async def read_json_object(request: Request, limit: int) -> dict:
    """An optional JSON object body (empty means `{}`)."""
    body = await read_body(request.receive, request.headers.get("content-length"),
                           request.headers.get("content-encoding"), limit)
    if not body.strip():
        return {}
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"malformed JSON in the request body: {e}") from None
    if type(data) is not dict:
        raise InvalidInput("the request body must be a JSON object")
    return data


def parameters_of(data: dict) -> dict:
    parameters = data.get("parameters", {})
    if type(parameters) is not dict:
        raise InvalidInput("'parameters' must be a JSON object")
    return parameters


def load_arguments(parameters: dict) -> tuple[str | None, dict[str, bytes] | None]:
    """Triton's load parameters: `config` (a JSON string) and `file:<path>` (base64 contents)."""
    config, files = None, {}
    for key, value in parameters.items():
        if key == "config":
            if type(value) is not str:
                raise InvalidInput("load parameter 'config' must be a string holding the model config as JSON")
            config = value
        elif key.startswith(FILE_PREFIX) and len(key) > len(FILE_PREFIX):
            if type(value) is not str:
                raise InvalidInput(f"load parameter '{key}' must be a base64 string")
            try:
                files[key[len(FILE_PREFIX):]] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidInput(f"load parameter '{key}' is not valid base64") from None
        else:
            raise InvalidInput(f"unknown load parameter '{key}' (expected 'config' or 'file:<path>')")
    return config, files or None


def create_router(dataplane: DataPlane, settings: ServerConfig) -> APIRouter:
    router = APIRouter()
    limit = settings.http_max_body_bytes
    # base64 makes model files 4/3 larger; a load request may carry up to load_file_max_bytes of them.
    load_limit = max(limit, settings.load_file_max_bytes * 4 // 3 + 1024 * 1024)

    @router.get("/v2/health/live")
    async def live():
        return status_response(dataplane.live(), "server")

    @router.get("/v2/health/ready")
    async def ready():
        return status_response(dataplane.ready(), "server")

    @router.get("/v2")
    async def server_metadata():
        return json_response(dataplane.metadata())

    @router.get("/v2/devices")
    async def devices():
        """The devices the backends' runtimes see (each backend's `modelplex_devices` report)."""
        return json_response(await dataplane.devices())

    @router.get("/v2/models/stats")
    async def all_statistics():
        return json_response(dataplane.statistics())

    @router.get("/v2/models/{model}")
    @router.get("/v2/models/{model}/versions/{version}")
    async def model_metadata(model: str, version: str = ""):
        return json_response(dataplane.model_metadata(model, version))

    @router.get("/v2/models/{model}/ready")
    @router.get("/v2/models/{model}/versions/{version}/ready")
    async def model_ready(model: str, version: str = ""):
        what = f"model '{model}'" + (f" version {version}" if version else "")
        return status_response(dataplane.model_ready(model, version), what)

    @router.get("/v2/models/{model}/config")
    @router.get("/v2/models/{model}/versions/{version}/config")
    async def config(model: str, version: str = ""):
        return json_response(model_config.to_dict(dataplane.model_config(model, version)))

    @router.get("/v2/models/{model}/stats")
    @router.get("/v2/models/{model}/versions/{version}/stats")
    async def statistics(model: str, version: str = ""):
        return json_response(dataplane.statistics(model, version))

    @router.get("/v2/models/{model}/engine_stats")
    @router.get("/v2/models/{model}/versions/{version}/engine_stats")
    async def engine_stats(model: str, version: str = ""):
        return json_response({"model_name": model, "instances": dataplane.engine_stats(model, version)})

    @router.post("/v2/repository/index")
    async def repository_index(request: Request):
        ready_only = (await read_json_object(request, limit)).get("ready", False)
        if type(ready_only) is not bool:
            raise InvalidInput("'ready' must be true or false")
        return json_response(dataplane.repository_index(ready_only))

    # `{name:path}` so that a name holding '/' reaches the name check (400) instead of a 404.
    @router.post("/v2/repository/models/{name:path}/load")
    async def load(name: str, request: Request):
        config, files = load_arguments(parameters_of(await read_json_object(request, load_limit)))
        await dataplane.load_model(name, config, files)
        return json_response({})

    @router.post("/v2/repository/models/{name:path}/unload")
    async def unload(name: str, request: Request):
        dependents = parameters_of(await read_json_object(request, limit)).get("unload_dependents", False)
        if type(dependents) is not bool:
            raise InvalidInput("'unload_dependents' must be true or false")
        await dataplane.unload_model(name, dependents)
        return json_response({})

    return router
