"""`POST /v1/responses`: OpenAI's Responses API (text, streaming, function tools) as a chat completion.

`input` (a text or message / `function_call` / `function_call_output` items) and `instructions` become
chat messages; function tools become chat tools; the chat completion's message becomes `output` items
(`message` with `output_text`, `function_call`). Streaming sends the Responses events (created,
output_item.added, content_part.added, output_text.delta, function_call_arguments.done, ...,
completed). Nothing is stored: `previous_response_id` is refused.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import Request
from pydantic import Field

from ..http.routes import json_response
from ..http.sse import sse_event, sse_response
from .completions import RouteContext, prepare_chat, read_request, run
from .errors import RequestError, describe
from .schemas import ChatCompletionRequest, OpenAIModel
from .streams import merged


class ResponsesRequest(OpenAIModel):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    text: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None

    def chat_request(self) -> ChatCompletionRequest:
        if self.previous_response_id is not None:
            raise RequestError("previous_response_id", "responses are not stored; send the whole conversation")
        fields: dict[str, Any] = {"model": self.model, "messages": self._messages(), "stream": self.stream,
                                  "parallel_tool_calls": self.parallel_tool_calls}
        for name in ("temperature", "top_p"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        if self.max_output_tokens is not None:
            fields["max_completion_tokens"] = self.max_output_tokens
        if self.tools:
            fields["tools"] = [_chat_tool(t) for t in self.tools]
        if self.tool_choice is not None:
            fields["tool_choice"] = _chat_tool_choice(self.tool_choice)
        if self.text and isinstance(self.text.get("format"), dict) and self.text["format"].get("type") != "text":
            fields["response_format"] = _response_format(self.text["format"])
        if self.stream:
            fields["stream_options"] = {"include_usage": True}
        return ChatCompletionRequest.model_validate(fields)

    def _messages(self) -> list[dict]:
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            return messages + [{"role": "user", "content": self.input}]
        for item in self.input:
            kind = item.get("type", "message")
            if kind == "message":
                messages.append({"role": item.get("role"), "content": _text(item.get("content"))})
            elif kind == "function_call":
                messages.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": item.get("call_id"), "type": "function",
                     "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}]})
            elif kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")})
            else:
                raise RequestError("input", f"input items of type '{kind}' are not supported")
        return messages


def _text(content) -> str:
    if isinstance(content, list):  # input_text / output_text parts
        if not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
            raise RequestError("input", "only text content parts are supported")
        return "".join(p["text"] for p in content)
    return content


def _chat_tool(tool: dict) -> dict:
    if tool.get("type") != "function":
        raise RequestError("tools", f"tools of type '{tool.get('type')}' are not supported (only function)")
    return {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters", "strict")
                                             if k in tool}}


def _chat_tool_choice(choice):
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise RequestError("tool_choice", "tool_choice must be auto, none, required or {type: function, name}")
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _response_format(fmt: dict) -> dict:
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    return {"type": fmt.get("type")}


def _response(body: ResponsesRequest, rid: str, output: list[dict], usage: dict | None, finish: str | None) -> dict:
    incomplete = finish == "length"
    return {"id": rid, "object": "response", "created_at": int(time.time()), "model": body.model,
            "status": "incomplete" if incomplete else ("completed" if usage is not None else "in_progress"),
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, "error": None,
            "instructions": body.instructions, "output": output, "parallel_tool_calls": body.parallel_tool_calls,
            "tool_choice": body.tool_choice or "auto", "tools": body.tools or [], "temperature": body.temperature,
            "top_p": body.top_p, "max_output_tokens": body.max_output_tokens, "metadata": body.metadata or {},
            "text": body.text or {"format": {"type": "text"}},
            "usage": None if usage is None else {
                "input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0}}}


def _message_item(text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": "msg_" + uuid.uuid4().hex, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}


def _call_item(call: dict) -> dict:
    return {"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": "completed"}


def output_items(message: dict) -> list[dict]:
    items = [_message_item(message["content"])] if message.get("content") else []
    return items + [_call_item(c) for c in message.get("tool_calls", [])]


def add_routes(router, ctx: RouteContext) -> None:
    dataplane = ctx.dataplane

    @router.post("/v1/responses")
    async def responses(request: Request):
        body = await read_request(request, ctx, ResponsesRequest)
        chat = body.chat_request()
        completion, prompts = prepare_chat(dataplane, chat)
        opened = await run(dataplane, request.receive, chat, prompts, completion)
        rid = "resp_" + uuid.uuid4().hex
        if opened is None:
            answer = completion.body(False)
            choice = answer["choices"][0]
            return json_response(_response(body, rid, output_items(choice["message"]), answer["usage"],
                                           choice["finish_reason"]))
        return sse_response(_events(body, rid, completion, opened))


async def _events(body: ResponsesRequest, rid: str, completion, opened):
    """The Responses stream: text deltas as they come; function calls once they parse."""
    sequence = iter(range(1 << 62))

    def event(kind: str, **fields) -> bytes:
        return sse_event({"type": kind, "sequence_number": next(sequence), **fields})

    yield event("response.created", response=_response(body, rid, [], None, None))
    message, text, output, finish = None, "", [], None
    stream = merged(opened)
    try:
        async for prompt, text_chunk in stream:
            chunk = completion.delta_chunk(text_chunk, prompt, False, False)
            if chunk is None or not chunk["choices"]:
                continue
            choice = chunk["choices"][0]
            finish = choice["finish_reason"] or finish
            delta = choice.get("delta", {})
            if delta.get("content"):
                if message is None:
                    message = _message_item("", "in_progress")
                    yield event("response.output_item.added", output_index=0, item=message)
                    yield event("response.content_part.added", item_id=message["id"], output_index=0,
                                content_index=0, part={"type": "output_text", "text": "", "annotations": []})
                text += delta["content"]
                yield event("response.output_text.delta", item_id=message["id"], output_index=0, content_index=0,
                            delta=delta["content"])
            for call in delta.get("tool_calls", []):
                if "id" in call:
                    output.append(_call_item(call))
                else:
                    output[-1]["arguments"] += call["function"]["arguments"]
    except Exception as exc:
        yield event("error", **describe(exc)[1]["error"])
        return
    finally:
        await stream.aclose()
    items = []
    if message is not None:
        done = {**_message_item(text), "id": message["id"]}
        part = done["content"][0]
        yield event("response.output_text.done", item_id=message["id"], output_index=0, content_index=0, text=text)
        yield event("response.content_part.done", item_id=message["id"], output_index=0, content_index=0, part=part)
        yield event("response.output_item.done", output_index=0, item=done)
        items.append(done)
    for item in output:
        index = len(items)
        yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress"})
        yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                    arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
        items.append(item)
    final = _response(body, rid, items, completion.usage, finish)
    yield event("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)
