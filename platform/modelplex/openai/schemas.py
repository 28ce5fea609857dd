"""OpenAI (and vLLM) request bodies as pydantic models, and their translation to the LLM protocol's fields.

Fields nobody declared are accepted and warned about once per name (vLLM's behaviour), or refused with
`--openai-strict-fields` (`fields.FieldPolicy`). Declared fields modelplex does not implement are
listed in `REFUSED` (a 400 naming the field when set to anything but their default) or `IGNORED`
(accepted, no effect); docs/openai_compat.md lists every field and is checked against these classes.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import RequestError

MAX_N = 16  # completions per request: each one holds its own KV blocks
MAX_TOP_LOGPROBS = 20
MAX_PROMPTS = 64  # prompts per /v1/completions request

# field -> why it is refused (a 400 when given a value other than its default)
REFUSED = {
    "use_beam_search": "beam search is not implemented",
    "length_penalty": "applies to beam search, which is not implemented",
    "logits_processors": "server-side code named by the client is not loaded",
    "return_tokens_as_token_ids": "not implemented",
    "kv_transfer_params": "disaggregated prefill is not implemented",
    "mm_processor_kwargs": "multimodal input is not implemented",
    "suffix": "fill-in-the-middle is not implemented",
    "reasoning_effort": "no reasoning parser is implemented",
    "logprob_token_ids": "not implemented",
    "prompt_embeds": "embedding inputs are not implemented",
    "functions": "the deprecated function-calling fields: use tools",
    "function_call": "the deprecated function-calling fields: use tool_choice",
}
# accepted and without effect: why
IGNORED = {
    "user": "recorded nowhere (as vLLM)",
    "request_id": "modelplex assigns its own ids",
    "spaces_between_special_tokens": "the tokenizer's decode decides",
    "guided_decoding_backend": "xgrammar is the one backend",
    "guided_whitespace_pattern": "xgrammar's default whitespace",
    "cache_salt": "prefix-cache entries are already kept apart per adapter",
    "include_reasoning": "no reasoning parser is implemented",
    "add_special_tokens": "prompts are tokenized without special tokens; chat templates add their own",
    "service_tier": "one tier",
    "store": "nothing is stored",
    "metadata": "nothing is stored",
}


class OpenAIModel(BaseModel):
    """Undeclared fields are kept (`model_extra`) for `fields.FieldPolicy` to warn about or refuse."""

    model_config = ConfigDict(extra="allow")


class StreamOptions(OpenAIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ResponseFormat(OpenAIModel):
    """OpenAI's `response_format`; the backend compiles `json_schema.schema` (and names this field if it cannot)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class StructuredOutputs(OpenAIModel):
    """vLLM's `structured_outputs`: one of json, regex, choice, grammar (xgrammar EBNF), json_object."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def constraint(self) -> dict[str, Any]:
        values = {"json": self.json_, "regex": self.regex, "choice": self.choice, "grammar": self.grammar,
                  "json_object": self.json_object}
        return {k: v for k, v in values.items() if v is not None}


class SamplingRequest(OpenAIModel):
    """Fields common to completions and chat completions."""

    model: str
    max_tokens: int | None = Field(None, ge=0)
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
    response_format: ResponseFormat | None = None
    ignore_eos: bool | None = None
    logit_bias: dict[str, float] | None = None
    min_tokens: int | None = Field(None, ge=0)
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    priority: int | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM fields refused or ignored (see REFUSED / IGNORED)
    use_beam_search: bool = False
    length_penalty: float = 1.0
    logits_processors: list[Any] | None = None
    return_tokens_as_token_ids: bool | None = None
    kv_transfer_params: dict[str, Any] | None = None
    logprob_token_ids: list[int] | None = None
    prompt_embeds: Any = None
    user: str | None = None
    request_id: str | None = None
    spaces_between_special_tokens: bool | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    cache_salt: str | None = None
    add_special_tokens: bool | None = None

    _PASSED = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed",
               "ignore_eos", "logit_bias", "min_tokens", "stop_token_ids", "include_stop_str_in_output",
               "skip_special_tokens", "allowed_token_ids", "bad_words", "prompt_logprobs", "truncate_prompt_tokens",
               "priority")

    def sampling_parameters(self, max_tokens: int | None, logprobs: int | None) -> dict[str, Any]:
        """The protocol's `sampling_parameters`; max_tokens None means up to the context length."""
        check_refused(self)
        if self.stream_options is not None and not self.stream:
            raise RequestError("stream_options", "stream_options is only allowed with stream: true")
        values = {"n": self.n, "max_tokens": max_tokens}
        for name in self._PASSED:
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
        constraint = self.constraint()
        if constraint is not None:
            if "response_format" in values:
                raise RequestError(self.constraint_field, "give either response_format or a guided/structured "
                                                          "output field")
            values["structured_outputs"] = constraint
        return values

    def constraint(self) -> dict[str, Any] | None:
        """structured_outputs, or the one guided_* field given (vLLM's older spelling)."""
        guided = {k: getattr(self, "guided_" + k) for k in ("json", "regex", "choice", "grammar")
                  if getattr(self, "guided_" + k) is not None}
        if self.structured_outputs is not None:
            guided = {**self.structured_outputs.constraint(), **guided} if guided else \
                self.structured_outputs.constraint()
        if len(guided) > 1:
            raise RequestError(self.constraint_field, f"give one output constraint, got {', '.join(sorted(guided))}")
        return guided or None

    @property
    def constraint_field(self) -> str:
        for kind in ("json", "regex", "choice", "grammar"):
            if getattr(self, "guided_" + kind) is not None:
                return "guided_" + kind
        return "structured_outputs"

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats

    def aliases(self) -> dict[str, str]:
        return {"structured_outputs": self.constraint_field}


Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: a text, or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            prompts = [prompt]
        elif prompt and all(isinstance(t, int) for t in prompt):
            prompts = [prompt]
        else:
            prompts = list(prompt)
        if not prompts:  # an empty one is refused by the data plane's limits (every route)
            raise RequestError("prompt", "prompts must not be empty")
        if len(prompts) > MAX_PROMPTS:
            raise RequestError("prompt", f"at most {MAX_PROMPTS} prompts per request, got {len(prompts)}")
        return prompts

    def sampling(self) -> dict[str, Any]:
        if self.max_tokens == 0 and not self.echo:
            raise RequestError("max_tokens", "max_tokens 0 needs echo: true (prompt scoring)")
        max_tokens = 16 if self.max_tokens is None else self.max_tokens  # OpenAI's default: 16
        values = self.sampling_parameters(max(max_tokens, 1), self.logprobs)  # 0: one token, dropped (vLLM)
        if self.echo and self.logprobs is not None:
            values["prompt_logprobs"] = max(self.logprobs, self.prompt_logprobs or 0)
        if self.best_of is not None:
            values["best_of"] = self.best_of  # the data plane's limits check it (only equal to n)
        return values

    @property
    def param_aliases(self) -> dict[str, str]:
        return {"text_input": "prompt", **self.aliases()}


class ToolFunction(OpenAIModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(OpenAIModel):
    type: Literal["function"]
    function: ToolFunction


class NamedFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingRequest):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None
    reasoning_effort: str | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: Any = None
    mm_processor_kwargs: dict[str, Any] | None = None
    include_reasoning: bool | None = None
    service_tier: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None

    def sampling(self) -> dict[str, Any]:
        if self.max_tokens == 0:
            raise RequestError("max_tokens", "max_tokens: must be >= 1")
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs", "top_logprobs needs logprobs: true")
        limit = self.max_completion_tokens or self.max_tokens  # None: up to the context length
        return self.sampling_parameters(limit, (self.top_logprobs or 0) if self.logprobs else None)

    def chat(self, tools: list[dict] | None) -> dict[str, Any]:
        """The protocol's chat object (the `messages` tensor), with the tools the template should see."""
        kwargs = dict(self.chat_template_kwargs or {})
        if self.documents is not None:
            kwargs["documents"] = self.documents
        return {"messages": self.messages, "tools": tools, "chat_template": self.chat_template,
                "chat_template_kwargs": kwargs, "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message}

    @property
    def param_aliases(self) -> dict[str, str]:
        """Backend field names -> this request's fields, for error `param`s."""
        return {"prompt": "messages", "text_input": "messages", "logprobs": "top_logprobs",
                "max_tokens": "max_completion_tokens" if self.max_completion_tokens else "max_tokens",
                **self.aliases(), **({"structured_outputs": "tools"} if self.forces_tools else {})}

    @property
    def forces_tools(self) -> bool:
        return self.tools is not None and (self.tool_choice == "required" or isinstance(self.tool_choice,
                                                                                        NamedToolChoice))


class EmbeddingRequest(OpenAIModel):
    model: str
    input: str | list[str] | list[int] | list[list[int]] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    add_special_tokens: bool | None = None

    def texts(self) -> list[str]:
        """The inputs as texts; token-id inputs are refused (the embedding models' tokenizers run inside them)."""
        if self.truncate_prompt_tokens is not None:
            raise RequestError("truncate_prompt_tokens", "not supported here: the embedding model tokenizes itself")
        items = [self.input] if isinstance(self.input, str) else self.input
        if any(not isinstance(t, str) for t in items):
            raise RequestError("input", "token-id input needs a model that takes token ids; this embedding "
                                        "model tokenizes text itself")
        if any(not t for t in items):
            raise RequestError("input", "input texts must not be empty")
        return items


def check_refused(body: BaseModel) -> None:
    """A 400 naming the first field in REFUSED the request sets to anything but its default."""
    for name, reason in REFUSED.items():
        info = type(body).model_fields.get(name)
        if info is not None and getattr(body, name) != info.default:
            raise RequestError(name, f"{name} is not supported: {reason}")
