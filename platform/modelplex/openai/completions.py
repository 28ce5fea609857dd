"""`POST /v1/completions` and `POST /v1/chat/completions`: an OpenAI request becomes one streaming
data-plane request per prompt (`text_input`, `messages` or `prompt_token_ids`, plus `sampling_parameters`),
and their responses become one OpenAI answer or a stream of chunks."""
from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass

import numpy as np
import orjson
from fastapi import Request

from ..core.errors import ModelplexError
from ..core.tensors import InferRequest, InferTensor
from ..dataplane import DataPlane
from ..http.body import read_body
from ..http.routes import json_response
from ..http.sse import sse_event, sse_response, until_disconnected
from ..llm.tensor_protocol import TOKEN_IDS_PARAMETER, USAGE_PARAMETER
from ..models.adapters import LORA_PARAMETER
from .errors import RequestError, describe, with_param
from .fields import FieldPolicy
from .models import model_parameter, require_llm, resolve_model
from .responses import Completion, Echo
from .schemas import ChatCompletionRequest, CompletionRequest, SamplingRequest
from .streams import merged, open_streams
from .tools import plan_tools

DONE = b"data: [DONE]\n\n"
VLLM_FLAGS = ("stream", "exclude_input_in_output")


@dataclass(frozen=True)
class RouteContext:
    """What every OpenAI route needs: the data plane, the body limit, the unknown-field policy."""

    dataplane: DataPlane
    limit: int
    fields: FieldPolicy


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


async def read_request(request: Request, ctx: RouteContext, schema):
    """The body validated by `schema`; undeclared fields warned about (or refused) by the policy."""
    body = schema.model_validate(await read_json(request, ctx.limit))
    ctx.fields.check(body, request.url.path)
    return body


def infer_request(dataplane: DataPlane, model: str, inputs: dict[str, str], adapter: str | None = None,
                  parameters: dict | None = None) -> InferRequest:
    """BYTES tensors of one element each (with a batch dimension if the model batches). A model with
    Triton's vLLM-backend flags gets `stream` and `exclude_input_in_output` true (as Triton's own
    OpenAI frontend sends them): deltas, without the prompt."""
    shape = (1, 1) if dataplane.model_config(model).max_batch_size > 0 else (1,)
    tensors = []
    for name, value in inputs.items():
        encoded = value.encode()
        dataplane.settings.tensor_limits.check_size(name, 0, len(encoded))  # the prompt (or messages)
        tensors.append(InferTensor.from_numpy(name, np.array([encoded], dtype=np.object_).reshape(shape)))
    declared = {t["name"] for t in dataplane.model_metadata(model)["inputs"]}
    for flag in VLLM_FLAGS:
        if flag in declared:
            tensors.append(InferTensor.from_numpy(flag, np.array([True]).reshape(shape)))
    parameters = dict(parameters or {})
    if adapter:
        parameters[LORA_PARAMETER] = adapter
    return InferRequest(model, tensors, parameters=parameters)


async def complete(dataplane: DataPlane, receive, body: SamplingRequest, prompts: list[dict], completion: Completion,
                   logprobs: bool):
    """Run one (chat) completion: a JSON answer, or an SSE stream when `body.stream`."""
    opened = await run(dataplane, receive, body, prompts, completion)
    if opened is None:
        return json_response(completion.body(logprobs))
    return sse_response(_events(completion, opened, body, logprobs))


async def run(dataplane: DataPlane, receive, body: SamplingRequest, prompts: list[dict], completion: Completion):
    """One data-plane request per prompt (`{tensor: text}`, or token ids under `prompt_token_ids`). Not
    streaming: every response is added to `completion` and None returned; streaming: the opened streams
    (`streams.open_streams`). Until then a client that disconnects cancels the work."""
    model, adapter = resolve_model(dataplane, body.model)  # an adapter's name runs its base model
    require_llm(dataplane, model)
    sampling = json.dumps(body.sampling())
    parameters = {USAGE_PARAMETER: True} if body.stream and body.continuous_usage else {}
    requests = []
    for prompt in prompts:
        extra = dict(parameters)
        if TOKEN_IDS_PARAMETER in prompt:
            extra[TOKEN_IDS_PARAMETER] = prompt[TOKEN_IDS_PARAMETER]
        inputs = {k: v for k, v in prompt.items() if k != TOKEN_IDS_PARAMETER}
        requests.append(infer_request(dataplane, model, {**inputs, "sampling_parameters": sampling}, adapter, extra))
    try:
        if not body.stream:
            await until_disconnected(receive, all_or_none([_collect(completion, i, dataplane.stream(r))
                                                           for i, r in enumerate(requests)]))
            return None
        return await until_disconnected(receive, open_streams([dataplane.stream(r) for r in requests]))
    except ModelplexError as exc:
        raise with_param(exc, body.param_aliases) from None


async def all_or_none(work: list) -> None:
    """Await every coroutine; the first failure cancels the others (their backends abort) and is raised."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _collect(completion: Completion, prompt: int, responses) -> None:
    async with contextlib.aclosing(responses):
        async for response in responses:
            completion.add(response, prompt)


async def _events(completion: Completion, opened, body: SamplingRequest, logprobs: bool):
    include_usage, continuous = body.include_usage, body.continuous_usage
    for chunk in completion.opening_chunks(include_usage, logprobs):
        yield sse_event(chunk)
    stream = merged(opened)
    try:
        async for prompt, response in stream:
            chunk = completion.delta_chunk(response, prompt, logprobs, include_usage, continuous)
            if chunk is not None:
                yield sse_event(chunk)
    except Exception as exc:
        yield sse_event(describe(exc)[1])
        return
    finally:
        await stream.aclose()
    if include_usage:
        yield sse_event(completion.chunk([], True, completion.usage))
    yield DONE


def add_routes(router, ctx: RouteContext) -> None:
    dataplane = ctx.dataplane

    @router.post("/v1/completions")
    async def completions(request: Request):
        body = await read_request(request, ctx, CompletionRequest)
        prompts = body.prompts()
        echo = None
        if body.echo:
            model = resolve_model(dataplane, body.model)[0]
            texts = [p if isinstance(p, str) else await dataplane.detokenize(model, p) for p in prompts]
            echo = Echo(texts, drop_output=body.max_tokens == 0)
        inputs = [{"text_input": p} if isinstance(p, str) else {TOKEN_IDS_PARAMETER: p} for p in prompts]
        completion = Completion(body.model, False, body.n, len(prompts), echo)
        return await complete(dataplane, request.receive, body, inputs, completion, logprobs=body.logprobs is not None)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await read_request(request, ctx, ChatCompletionRequest)
        completion, prompts = prepare_chat(dataplane, body)
        return await complete(dataplane, request.receive, body, prompts, completion, logprobs=body.logprobs)


def prepare_chat(dataplane: DataPlane, body: ChatCompletionRequest) -> tuple[Completion, list[dict]]:
    """The completion to assemble and the one `messages` prompt of a chat request (tools planned)."""
    model = resolve_model(dataplane, body.model)[0]
    plan = plan_tools(body, model_parameter(dataplane, model, "tool_call_parser"))
    if plan.constraint is not None:
        if body.constraint() is not None or body.response_format is not None:
            raise RequestError("tool_choice", "tool_choice 'required' or a named function cannot be combined "
                                              "with response_format or a guided/structured output field")
        body.guided_json = plan.constraint["json"]  # its errors name `tools` (param_aliases)
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    last = body.messages[-1]
    echo = Echo([last.get("content") or ""]) if body.echo and last.get("role") == "assistant" else None
    completion = Completion(body.model, True, body.n, 1, echo, plan)
    return completion, [{"messages": json.dumps(body.chat(tools))}]
