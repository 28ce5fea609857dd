"""`POST /v1/completions` and `POST /v1/chat/completions`: an OpenAI request becomes one
`DataPlane.generate` per prompt (`GenerateInputs`: text, chat or token ids, plus the sampling fields),
and their `TextChunk`s become one OpenAI answer or a stream of chunks."""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import orjson
from fastapi import Request

from ..core.errors import ModelplexError
from ..dataplane import DataPlane
from ..http.body import read_body
from ..http.routes import json_response
from ..http.sse import sse_event, sse_response, until_disconnected
from ..llm.tensor_protocol import GenerateInputs, chat_request, prompt_token_ids
from .errors import RequestError, describe, with_param
from .fields import FieldPolicy
from .models import model_parameter, require_llm, resolve_model
from .responses import Completion, Echo
from .schemas import ChatCompletionRequest, CompletionRequest, SamplingRequest
from .streams import merged, open_streams
from .tools import plan_tools

DONE = b"data: [DONE]\n\n"


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


async def complete(dataplane: DataPlane, receive, body: SamplingRequest, prompts: list[GenerateInputs],
                   completion: Completion, logprobs: bool):
    """Run one (chat) completion: a JSON answer, or an SSE stream when `body.stream`."""
    opened = await run(dataplane, receive, body, prompts, completion)
    if opened is None:
        return json_response(completion.body(logprobs))
    return sse_response(_events(completion, opened, body, logprobs))


async def run(dataplane: DataPlane, receive, body: SamplingRequest, prompts: list[GenerateInputs],
              completion: Completion):
    """One `DataPlane.generate` per prompt, with the body's sampling fields and adapter. Not streaming:
    every chunk is added to `completion` and None returned; streaming: the opened streams
    (`streams.open_streams`). Until then a client that disconnects cancels the work."""
    model, adapter = resolve_model(dataplane, body.model)  # an adapter's name runs its base model
    require_llm(dataplane, model)
    try:
        sampling = body.sampling()
        for prompt in prompts:
            prompt.sampling, prompt.lora = dict(sampling), adapter or ""
        streams = [dataplane.generate(model, "", prompt) for prompt in prompts]
        if not body.stream:
            await until_disconnected(receive, all_or_none([_collect(completion, i, s) for i, s in enumerate(streams)]))
            return None
        return await until_disconnected(receive, open_streams(streams))
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


async def _collect(completion: Completion, prompt: int, chunks) -> None:
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            completion.add(chunk, prompt)


async def _events(completion: Completion, opened, body: SamplingRequest, logprobs: bool):
    include_usage, continuous = body.include_usage, body.continuous_usage
    for chunk in completion.opening_chunks(include_usage, logprobs):
        yield sse_event(chunk)
    stream = merged(opened)
    try:
        async for prompt, text_chunk in stream:
            chunk = completion.delta_chunk(text_chunk, prompt, logprobs, include_usage, continuous)
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
        inputs = [GenerateInputs(p, None, {}) if isinstance(p, str)
                  else GenerateInputs(None, None, {}, prompt_token_ids=prompt_token_ids(p)) for p in prompts]
        completion = Completion(body.model, False, body.n, len(prompts), echo)
        return await complete(dataplane, request.receive, body, inputs, completion, logprobs=body.logprobs is not None)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await read_request(request, ctx, ChatCompletionRequest)
        completion, prompts = prepare_chat(dataplane, body)
        return await complete(dataplane, request.receive, body, prompts, completion, logprobs=body.logprobs)


def prepare_chat(dataplane: DataPlane, body: ChatCompletionRequest) -> tuple[Completion, list[GenerateInputs]]:
    """The completion to assemble and the one chat prompt of a chat request (tools planned)."""
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
    try:
        chat = chat_request(body.chat(tools))
    except ModelplexError as exc:
        raise with_param(exc, body.param_aliases) from None
    return completion, [GenerateInputs(None, chat, {})]
