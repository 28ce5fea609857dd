"""OpenAI request bodies as pydantic models, and their translation to the backend's sampling fields.

Unknown fields are refused (as OpenAI does) rather than ignored: a client sending `tools` or
`logit_bias` must learn they are not applied.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import RequestError

MAX_N = 16  # completions per request: each one holds its own KV blocks
MAX_TOP_LOGPROBS = 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


class ResponseFormat(_Strict):
    """OpenAI's `response_format`; the backend compiles `json_schema.schema` (and names this field if it cannot)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class SamplingRequest(_Strict):
    """Fields common to completions and chat completions."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    ignore_eos: bool | None = None

    def sampling_parameters(self, max_tokens: int | None, logprobs: int | None) -> dict[str, Any]:
        """The backend's `sampling_parameters` JSON; max_tokens None means up to the context length."""
        if self.stream_options is not None and not self.stream:
            raise RequestError("stream_options", "stream_options is only allowed with stream: true")
        values = {"n": self.n, "max_tokens": max_tokens}
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                     "seed", "ignore_eos"):
            if getattr(self, name) is not None:
                values[name] = getattr(self, name)
        if self.top_k is not None:
            values["top_k"] = max(self.top_k, 0)  # vLLM's -1 and our 0 both mean "no top-k"
        if self.stop:
            values["stop"] = [self.stop] if isinstance(self.stop, str) else self.stop
        if logprobs is not None:
            values["logprobs"] = logprobs
        if self.response_format is not None and self.response_format.type != "text":
            values["response_format"] = self.response_format.model_dump(exclude_none=True)
        return values

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingRequest):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def text(self) -> str:
        if isinstance(self.prompt, list):
            if len(self.prompt) != 1:
                raise RequestError("prompt", "one prompt per request (send a string or a list of one string)")
            return self.prompt[0]
        return self.prompt

    def sampling(self) -> dict[str, Any]:
        if self.suffix:
            raise RequestError("suffix", "suffix is not supported")
        if self.best_of not in (None, self.n):
            raise RequestError("best_of", "best_of other than n is not supported")
        if self.echo and self.logprobs is not None:
            raise RequestError("echo", "echo with logprobs is not supported (no prompt logprobs)")
        return self.sampling_parameters(self.max_tokens or 16, self.logprobs)  # OpenAI's default: 16

    @property
    def param_aliases(self) -> dict[str, str]:
        return {"text_input": "prompt"}


class ChatCompletionRequest(SamplingRequest):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def sampling(self) -> dict[str, Any]:
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs", "top_logprobs needs logprobs: true")
        limit = self.max_completion_tokens or self.max_tokens  # None: up to the context length
        return self.sampling_parameters(limit, (self.top_logprobs or 0) if self.logprobs else None)

    @property
    def param_aliases(self) -> dict[str, str]:
        """Backend field names -> this request's fields, for error `param`s."""
        return {"prompt": "messages", "text_input": "messages", "logprobs": "top_logprobs",
                "max_tokens": "max_completion_tokens" if self.max_completion_tokens else "max_tokens"}


class EmbeddingRequest(_Strict):
    model: str
    input: str | list[str] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
