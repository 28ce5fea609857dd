"""Triton's generate extension: `POST /v2/models/{m}[/versions/{v}]/generate` and `.../generate_stream`.

Top-level JSON fields named like a model input become tensors shaped to the input's dims (a
scalar fills any shape of one element; objects and lists for a BYTES input are sent as JSON text);
`parameters`, every other field and the headers `--http-header-forward-pattern` matches become request
parameters, where the native_gpu backend reads sampling fields (as Triton's vLLM backend does).
Each response is a flat object: model_name, model_version, id, one field per output and the
response parameters. `generate` on a decoupled model joins the streamed text into one answer.
"""
from __future__ import annotations

import contextlib

import numpy as np
import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from ..core.errors import InvalidInput, ModelplexError
from ..core.tensors import InferRequest, InferResponse, InferTensor, TensorLimits, numpy_dtype
from ..dataplane import DataPlane
from .body import ClientGone
from .forwarding import HeaderForwarding
from .routes import json_response, read_json_object
from .sse import CLIENT_CLOSED, first_and_rest, relay, sse_event, sse_response, until_disconnected


def generate_request(dataplane: DataPlane, model: str, version: str, body: dict,
                     forwarded: dict | None = None) -> InferRequest:
    inputs = {t["name"]: t for t in dataplane.model_metadata(model, version)["inputs"]}
    parameters = body.pop("parameters", {})
    if type(parameters) is not dict:
        raise InvalidInput("'parameters' must be a JSON object")
    request_id = body.pop("id", "")
    if type(request_id) is not str:
        raise InvalidInput("'id' must be a string")
    tensors = []
    for name, value in body.items():
        if name not in inputs:
            parameters[name] = value
            continue
        spec = inputs[name]
        tensors.append(_tensor(name, spec["datatype"], spec["shape"], value, dataplane.settings.tensor_limits))
    if not tensors:
        raise InvalidInput(f"the request names none of model '{model}''s inputs ({', '.join(inputs)})")
    return InferRequest(model, tensors, version, request_id, parameters=parameters | (forwarded or {}))


def _tensor(name: str, datatype: str, dims: list[int], value, limits: TensorLimits) -> InferTensor:
    if datatype == "BYTES":
        text = (value if isinstance(value, str) else orjson.dumps(value).decode()).encode()
        limits.check_size(name, 0, len(text))  # e.g. the prompt
        array = np.array([text], dtype=np.object_)
    else:
        try:
            array = np.array(value, dtype=numpy_dtype(datatype)).reshape(-1)
        except (TypeError, ValueError):
            raise InvalidInput(f"input '{name}' must hold {datatype} values, got {value!r}") from None
        limits.check_count(name, datatype, array.size)
    return InferTensor.from_numpy(name, array.reshape(shape_for(name, dims, array.size)))


def shape_for(name: str, dims: list[int], count: int) -> list[int]:
    """The input's metadata shape (batch dimension included) filled with `count` elements, as
    Triton's generate does: fixed dimensions take their share, the innermost variable one the rest,
    other variable ones 1 (so a scalar fills dims [1, 1], and [-1, 1] of a batching model as [1, 1])."""
    shape, remaining = list(dims), count
    for d in shape:
        if d != -1:
            if d == 0 or remaining % d:
                raise InvalidInput(f"The schema can not convert input '{name}' to tensor with proper shape")
            remaining //= d
    for i in reversed(range(len(shape))):
        if shape[i] == -1:
            shape[i], remaining = remaining, 1
    if remaining != 1:
        raise InvalidInput(f"The schema can not convert input '{name}' to tensor with proper shape")
    return shape


def generate_answer(response: InferResponse) -> dict:
    answer = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        answer["id"] = response.id
    for tensor in response.outputs:
        values = tensor.data.reshape(-1)
        if tensor.datatype == "BYTES":
            values = [v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in values]
        else:
            values = values.tolist()
        answer[tensor.name] = values[0] if len(values) == 1 else values
    return answer | response.parameters


def _join(responses: list[InferResponse]) -> InferResponse:
    """A stream's text deltas as one response: BYTES outputs concatenated, the last one's parameters,
    every response's token log-probabilities (a JSON list each, one entry per token) in one list."""
    if any(r.parameters.get("index", 0) for r in responses):
        raise InvalidInput("n: generate returns one text; use /v1/completions for several", param="n")
    last = responses[-1]
    if len(responses) > 1 and "logprobs" in last.parameters:
        last.parameters["logprobs"] = "[" + ",".join(
            p[1:-1] for r in responses if len(p := r.parameters.get("logprobs", "[]")) > 2) + "]"
    first_prompt_logprobs = responses[0].parameters.get("prompt_logprobs")
    if first_prompt_logprobs is not None:
        last.parameters.setdefault("prompt_logprobs", first_prompt_logprobs)
    for tensor in last.outputs:
        if tensor.datatype == "BYTES":
            parts = [t.data.reshape(-1)[0] for r in responses for t in r.outputs if t.name == tensor.name]
            tensor.data = np.array([b"".join(parts)], dtype=np.object_)
            tensor.shape = [1]
    return last


async def _collect(stream) -> list[InferResponse]:
    async with contextlib.aclosing(stream):
        return [response async for response in stream]


def create_generate_router(dataplane: DataPlane) -> APIRouter:
    router = APIRouter()
    limit = dataplane.settings.http_max_body_bytes
    forward = HeaderForwarding.of(dataplane.settings.http_header_forward_pattern)

    @router.post("/v2/models/{model}/generate")
    @router.post("/v2/models/{model}/versions/{version}/generate")
    async def generate(model: str, request: Request, version: str = ""):
        infer = generate_request(dataplane, model, version, await read_json_object(request, limit),
                                 forward.parameters(request.headers.raw) if forward else None)
        try:
            responses = await until_disconnected(request.receive, _collect(dataplane.stream(infer)))
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        if not responses:
            raise InvalidInput(f"model '{model}' sent no response")
        return json_response(generate_answer(_join(responses)))

    @router.post("/v2/models/{model}/generate_stream")
    @router.post("/v2/models/{model}/versions/{version}/generate_stream")
    async def generate_stream(model: str, request: Request, version: str = ""):
        infer = generate_request(dataplane, model, version, await read_json_object(request, limit),
                                 forward.parameters(request.headers.raw) if forward else None)
        try:
            first, stream = await until_disconnected(request.receive, first_and_rest(dataplane.stream(infer)))
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        errors = (lambda exc: {"error": exc.message if isinstance(exc, ModelplexError) else f"internal error: {exc}"})
        return sse_response(relay(first, stream, lambda r: [sse_event(generate_answer(r))], errors))

    return router
