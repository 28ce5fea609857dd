"""OpenAI response objects built from the data plane's `TextChunk`s: whole answers and stream chunks.

A chunk carries a completion's text delta, its index, finish reason, token counts and typed
log-probabilities (`modelplex.llm.contract`).
A request of several prompts runs one generate call per prompt: choice `prompt * n + index`, as vLLM
numbers them. Echo puts the prompt (and, with logprobs, its log-probabilities) before the output;
`max_tokens: 0` keeps only that (the one token generated is dropped, as vLLM does).
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from ..llm.contract import TextChunk, TokenLogprob
from .tools import ToolPlan, ToolStream, message


@dataclass
class Choice:
    text: str = ""
    finish_reason: str | None = None
    num_output_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] | None = None
    tools: ToolStream | None = None


@dataclass(frozen=True)
class Echo:
    """Per prompt: its text before the output, and whether the output is dropped (max_tokens 0)."""

    prefixes: list[str]
    drop_output: bool = False


class Completion:
    """One OpenAI (chat) completion being assembled: `add` each backend response (of prompt `p`), then
    `body()`, or `delta_chunk` per response when streaming. `chat` picks the chat shapes."""

    def __init__(self, model: str, chat: bool, n: int, num_prompts: int = 1, echo: Echo | None = None,
                 tools: ToolPlan | None = None):
        self.model, self.chat, self.n = model, chat, n
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.echo = echo
        self.tools = tools or ToolPlan("none")
        self.choices = [Choice(text=echo.prefixes[i // n] if echo else "",
                               tools=ToolStream(self.tools) if chat else None) for i in range(n * num_prompts)]
        self.num_prompt_tokens = [0] * num_prompts

    def add(self, chunk: TextChunk, prompt: int = 0) -> tuple[int, str, list[TokenLogprob]]:
        """Record one chunk; returns its (choice index, text delta, logprob entries)."""
        index = prompt * self.n + chunk.index
        choice = self.choices[index]
        delta, entries = chunk.text, chunk.logprobs or []
        if chunk.prompt_logprobs is not None and choice.prompt_logprobs is None:
            choice.prompt_logprobs = chunk.prompt_logprobs
        if self.echo is not None and self.echo.drop_output:
            delta, entries = "", []
        choice.text += delta
        choice.logprobs += entries
        self.num_prompt_tokens[prompt] = chunk.num_prompt_tokens
        choice.num_output_tokens = chunk.num_output_tokens
        if chunk.finish_reason:
            choice.finish_reason = chunk.finish_reason
            if self.echo is not None and self.echo.drop_output:
                choice.finish_reason, choice.num_output_tokens = "length", 0
        return index, delta, entries

    @property
    def usage(self) -> dict:
        prompt_tokens = sum(self.num_prompt_tokens)
        completion_tokens = sum(c.num_output_tokens for c in self.choices)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def body(self, logprobs: bool) -> dict:
        choices = []
        for index, choice in enumerate(self.choices):
            entry = {"index": index, "finish_reason": choice.finish_reason,
                     "logprobs": self._logprobs(self._entries(choice), 0) if logprobs else None}
            if self.chat:
                entry["message"], entry["finish_reason"] = message(self.tools, choice.text, choice.finish_reason)
            else:
                entry["text"] = choice.text
            if choice.prompt_logprobs is not None:
                entry["prompt_logprobs"] = vllm_prompt_logprobs(choice.prompt_logprobs)
            choices.append(entry)
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": self.usage}

    def _entries(self, choice: Choice) -> list[TokenLogprob]:
        """Logprob entries of a choice's text: with echo, the prompt's first."""
        if self.echo is not None and choice.prompt_logprobs is not None:
            return [*choice.prompt_logprobs, *choice.logprobs]
        return choice.logprobs

    def chunk(self, choices: list[dict], usage: bool, with_usage: dict | None = None) -> dict:
        chunk = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                 "created": self.created, "model": self.model, "choices": choices}
        if usage:
            chunk["usage"] = with_usage
        return chunk

    def opening_chunks(self, usage: bool, logprobs: bool) -> list[dict]:
        """Chat streams open each choice with the assistant role, as OpenAI's do; an echoed completion
        stream opens each with its prompt."""
        if self.chat:
            return [self.chunk([{"index": i, "delta": {"role": "assistant", "content": c.text}, "logprobs": None,
                                 "finish_reason": None}], usage) for i, c in enumerate(self.choices)]
        if self.echo is None:
            return []
        return [self.chunk([{"index": i, "text": c.text, "logprobs": None, "finish_reason": None}], usage)
                for i, c in enumerate(self.choices)]

    def delta_chunk(self, chunk: TextChunk, prompt: int, logprobs: bool, usage: bool,
                    continuous: bool = False) -> dict | None:
        """The OpenAI chunk for one text chunk (None when it carries nothing to send yet); `usage` puts the
        key in (null), `continuous` the counts so far (vLLM's continuous_usage_stats)."""
        choice = self.choices[prompt * self.n + chunk.index]
        offset = len(choice.text)
        had_prompt_logprobs = choice.prompt_logprobs is not None
        index, delta, entries = self.add(chunk, prompt)
        if self.echo is not None and choice.prompt_logprobs is not None and not had_prompt_logprobs:
            entries, offset = [*choice.prompt_logprobs, *entries], 0
        out = {"index": index, "finish_reason": choice.finish_reason,
               "logprobs": self._logprobs(entries, offset) if logprobs else None}
        if self.chat:
            out["delta"] = choice.tools.feed(delta)
            if choice.finish_reason is not None:
                last, out["finish_reason"] = choice.tools.finish(choice.finish_reason)
                out["delta"] = _merge(out["delta"], last)
            if not out["delta"] and out["finish_reason"] is None and not (logprobs and entries):
                return None
        else:
            out["text"] = delta
        return self.chunk([out], usage or continuous, self.usage if continuous else None)

    def _logprobs(self, entries: list[TokenLogprob], offset: int) -> dict:
        if self.chat:
            return {"content": [_chat_logprob(e) | {"top_logprobs": [_chat_logprob(t) for t in e.top]}
                                for e in entries]}
        offsets = []
        for entry in entries:
            offsets.append(offset)
            offset += len(entry.token)
        return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{t.token: t.logprob for t in e.top} if e.logprob is not None else None
                                 for e in entries],
                "text_offset": offsets}


def _merge(first: dict, second: dict) -> dict:
    out = dict(first)
    for key, value in second.items():
        out[key] = out.get(key, "") + value if key == "content" else value
    return out


def _chat_logprob(entry: TokenLogprob) -> dict:
    return {"token": entry.token, "logprob": entry.logprob, "bytes": list(entry.token.encode())}


def vllm_prompt_logprobs(entries: list[TokenLogprob]) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: per prompt token None (the first) or {token id: {logprob, rank, decoded_token}}."""
    out = []
    for entry in entries:
        if entry.logprob is None:
            out.append(None)
            continue
        found = {str(entry.token_id): {"logprob": entry.logprob, "decoded_token": entry.token}}
        for rank, alt in enumerate(entry.top, 1):
            found.setdefault(str(alt.token_id), {"logprob": alt.logprob, "decoded_token": alt.token})
            found[str(alt.token_id)]["rank"] = rank
        out.append(found)
    return out
