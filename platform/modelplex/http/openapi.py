"""The server's OpenAPI document (`GET /openapi.json`): FastAPI's view of its routes, plus the
request bodies of the routes that read raw JSON themselves (KServe v2 infer, Triton's generate,
repository, trace and logging settings), so that clients and API fuzzers know what to send."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from .. import __version__
from ..core.tensors import TRITON_TO_NUMPY

_OBJECT = {"type": "object"}
_TENSOR = {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
    "name": {"type": "string"},
    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    "datatype": {"type": "string", "enum": sorted(TRITON_TO_NUMPY)},
    "parameters": _OBJECT,
    "data": {"type": "array"}}}
INFER_REQUEST = {"type": "object", "required": ["inputs"], "properties": {
    "id": {"type": "string"},
    "parameters": _OBJECT,
    "inputs": {"type": "array", "minItems": 1, "items": _TENSOR},
    "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "parameters": _OBJECT}}}}}
GENERATE_REQUEST = {"type": "object", "properties": {
    "text_input": {"type": "string"}, "parameters": _OBJECT, "max_tokens": {"type": "integer"},
    "temperature": {"type": "number"}, "stream": {"type": "boolean"}}}
PARAMETERS = {"type": "object", "properties": {"parameters": _OBJECT}}
# Routes FastAPI sees but whose bodies the handlers read themselves: path -> request body schema.
BODIES = {
    "/v2/models/{model}/generate": GENERATE_REQUEST,
    "/v2/models/{model}/versions/{version}/generate": GENERATE_REQUEST,
    "/v2/models/{model}/generate_stream": GENERATE_REQUEST,
    "/v2/models/{model}/versions/{version}/generate_stream": GENERATE_REQUEST,
    "/v2/repository/index": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
    "/v2/repository/models/{name}/load": PARAMETERS,
    "/v2/repository/models/{name}/unload": PARAMETERS,
    "/v2/repository/models/{model}/adapters/{adapter}/load": PARAMETERS,
    "/v2/repository/models/{model}/adapters/{adapter}/unload": PARAMETERS,
    "/v2/trace/setting": _OBJECT,
    "/v2/models/{model}/trace/setting": _OBJECT,
    "/v2/logging": _OBJECT,
}


def _path_parameters(path: str) -> list[dict]:
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    return [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names]


def _infer_operation(path: str) -> dict:
    return {"post": {"summary": "KServe v2 inference", "parameters": _path_parameters(path),
                     "requestBody": {"required": True, "content": {"application/json": {"schema": INFER_REQUEST}}},
                     "responses": {"200": {"description": "the inference response"},
                                   "400": {"description": "bad input"}, "404": {"description": "no such model"}}}}


def openapi_document(app: FastAPI) -> dict:
    doc = get_openapi(title="modelplex", version=__version__, routes=app.routes)
    paths = doc["paths"]
    for path, schema in BODIES.items():
        post = paths.get(path, {}).get("post")
        if post is not None and "requestBody" not in post:
            post["requestBody"] = {"content": {"application/json": {"schema": schema}}}
    for path in ("/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer"):
        paths[path] = _infer_operation(path)
    return doc
