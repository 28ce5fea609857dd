"""OpenAI response objects built from the backend's responses: whole answers and stream chunks.

A backend response carries a text delta in `text_output` and parameters `index`, `finish_reason`,
`num_input_tokens`, `num_output_tokens` and `logprobs` (see the native_gpu protocol).
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from ..core.tensors import InferResponse
from .errors import RequestError


@dataclass
class Choice:
    text: str = ""
    finish_reason: str | None = None
    num_output_tokens: int = 0
    logprobs: list[dict] = field(default_factory=list)


def text_of(response: InferResponse) -> str:
    for tensor in response.outputs:
        if tensor.name == "text_output":
            value = tensor.data.reshape(-1)[0] if tensor.data.size else b""
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    raise RequestError("model", f"model '{response.model_name}' answered without a text_output")


class Completion:
    """One OpenAI (chat) completion being assembled: `add` each backend response, then `body()`,
    or `chunk(response)` per response when streaming. `chat` picks the chat shapes."""

    def __init__(self, model: str, chat: bool, n: int, prefix: str = ""):
        self.model, self.chat = model, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.choices = [Choice(text=prefix) for _ in range(n)]
        self.num_prompt_tokens = 0

    def add(self, response: InferResponse) -> tuple[int, str, list[dict]]:
        """Record one response; returns its (index, text delta, logprob entries)."""
        params = response.parameters
        index = int(params.get("index", 0))
        choice = self.choices[index]
        delta = text_of(response)
        entries = json.loads(params["logprobs"]) if "logprobs" in params else []
        choice.text += delta
        choice.logprobs += entries
        if params.get("finish_reason"):
            choice.finish_reason = params["finish_reason"]
            choice.num_output_tokens = int(params.get("num_output_tokens", 0))
            self.num_prompt_tokens = int(params.get("num_input_tokens", self.num_prompt_tokens))
        return index, delta, entries

    @property
    def usage(self) -> dict:
        completion_tokens = sum(c.num_output_tokens for c in self.choices)
        return {"prompt_tokens": self.num_prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.num_prompt_tokens + completion_tokens}

    def body(self, logprobs: bool) -> dict:
        choices = []
        for index, choice in enumerate(self.choices):
            entry = {"index": index, "finish_reason": choice.finish_reason,
                     "logprobs": self._logprobs(choice.logprobs, 0) if logprobs else None}
            if self.chat:
                entry["message"] = {"role": "assistant", "content": choice.text}
            else:
                entry["text"] = choice.text
            choices.append(entry)
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": self.usage}

    def chunk(self, choices: list[dict], usage: bool, with_usage: dict | None = None) -> dict:
        chunk = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                 "created": self.created, "model": self.model, "choices": choices}
        if usage:
            chunk["usage"] = with_usage
        return chunk

    def role_chunks(self, usage: bool) -> list[dict]:
        """Chat streams open each choice with the assistant role, as OpenAI's do."""
        return [self.chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}], usage) for i in range(len(self.choices))]

    def delta_chunk(self, response: InferResponse, logprobs: bool, usage: bool) -> dict:
        offset = len(self.choices[int(response.parameters.get("index", 0))].text)
        index, delta, entries = self.add(response)
        choice = {"index": index, "finish_reason": self.choices[index].finish_reason,
                  "logprobs": self._logprobs(entries, offset) if logprobs else None}
        if self.chat:
            choice["delta"] = {"content": delta}
        else:
            choice["text"] = delta
        return self.chunk([choice], usage)

    def _logprobs(self, entries: list[dict], offset: int) -> dict:
        if self.chat:
            return {"content": [_chat_logprob(e) | {"top_logprobs": [_chat_logprob(t) for t in e["top_logprobs"]]}
                                for e in entries]}
        offsets = []
        for entry in entries:
            offsets.append(offset)
            offset += len(entry["token"])
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                "text_offset": offsets}


def _chat_logprob(entry: dict) -> dict:
    return {"token": entry["token"], "logprob": entry["logprob"], "bytes": list(entry["token"].encode())}
