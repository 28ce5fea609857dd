"""`POST /v1/completions` and `POST /v1/chat/completions`: an OpenAI request becomes one streaming
data-plane request (`text_input` or `messages`, plus `sampling_parameters`), and its responses
become one OpenAI answer or a stream of chunks."""
from __future__ import annotations

import contextlib
import json

import numpy as np
import orjson
from fastapi import Request

from ..core.errors import ModelplexError
from ..core.tensors import InferRequest, InferTensor
from ..dataplane import DataPlane
from ..http.body import read_body
from ..http.routes import json_response
from ..http.sse import first_and_rest, relay, sse_event, sse_response, until_disconnected
from ..models.adapters import LORA_PARAMETER
from .errors import RequestError, describe, with_param
from .models import require_llm, resolve_model
from .responses import Completion
from .schemas import ChatCompletionRequest, CompletionRequest, SamplingRequest

DONE = b"data: [DONE]\n\n"


async def read_json(request: Request, limit: int) -> dict:
    body = await read_body(request.receive, request.headers.get("content-length"),
                           request.headers.get("content-encoding"), limit)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(None, f"malformed JSON in the request body: {exc}") from None
    if type(data) is not dict:
        raise RequestError(None, "the request body must be a JSON object")
    return data


def infer_request(dataplane: DataPlane, model: str, inputs: dict[str, str], adapter: str | None = None) -> InferRequest:
    """BYTES tensors of one element each (with a batch dimension if the model batches)."""
    shape = (1, 1) if dataplane.model_config(model).max_batch_size > 0 else (1,)
    tensors = []
    for name, value in inputs.items():
        encoded = value.encode()
        dataplane.settings.tensor_limits.check_size(name, 0, len(encoded))  # the prompt (or messages)
        tensors.append(InferTensor.from_numpy(name, np.array([encoded], dtype=np.object_).reshape(shape)))
    return InferRequest(model, tensors, parameters={LORA_PARAMETER: adapter} if adapter else {})


async def complete(dataplane: DataPlane, receive, body: SamplingRequest, inputs: dict[str, str], chat: bool,
                   logprobs: bool, prefix: str = ""):
    """Run one (chat) completion: a JSON answer, or an SSE stream when `body.stream`. Until the answer
    (or the stream's first chunk) is ready, a client that disconnects cancels it."""
    model, adapter = resolve_model(dataplane, body.model)  # an adapter's name runs its base model
    require_llm(dataplane, model)
    sampling = body.sampling()
    request = infer_request(dataplane, model, {**inputs, "sampling_parameters": json.dumps(sampling)}, adapter)
    completion = Completion(body.model, chat, body.n, prefix)
    try:
        if not body.stream:
            await until_disconnected(receive, _collect(completion, dataplane.stream(request)))
            return json_response(completion.body(logprobs))
        first, responses = await until_disconnected(receive, first_and_rest(dataplane.stream(request)))
    except ModelplexError as exc:
        raise with_param(exc, body.param_aliases) from None
    return sse_response(_events(completion, first, responses, body.include_usage, logprobs, prefix))


async def _collect(completion: Completion, responses) -> None:
    async with contextlib.aclosing(responses):
        async for response in responses:
            completion.add(response)


async def _events(completion: Completion, first, responses, include_usage: bool, logprobs: bool, prefix: str):
    if completion.chat:
        for chunk in completion.role_chunks(include_usage):
            yield sse_event(chunk)
    elif prefix:  # echo: the prompt comes first
        for index in range(len(completion.choices)):
            yield sse_event(completion.chunk([{"index": index, "text": prefix, "logprobs": None,
                                               "finish_reason": None}], include_usage))

    def encode(response):
        return [sse_event(completion.delta_chunk(response, logprobs, include_usage))]

    async for event in relay(first, responses, encode, lambda exc: describe(exc)[1]):
        yield event
    if include_usage:
        yield sse_event(completion.chunk([], True, completion.usage))
    yield DONE


def add_routes(router, dataplane: DataPlane, limit: int) -> None:
    @router.post("/v1/completions")
    async def completions(request: Request):
        body = CompletionRequest.model_validate(await read_json(request, limit))
        prompt = body.text()
        return await complete(dataplane, request.receive, body, {"text_input": prompt}, chat=False,
                              logprobs=body.logprobs is not None, prefix=prompt if body.echo else "")

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = ChatCompletionRequest.model_validate(await read_json(request, limit))
        return await complete(dataplane, request.receive, body, {"messages": json.dumps(body.messages)}, chat=True,
                              logprobs=body.logprobs)
