"""The tensor protocol of text-generation models (Triton's vLLM-backend tensors, extended), for every LLM backend.

In: `text_input` (BYTES), or `messages` (BYTES: a JSON list of chat messages the backend renders with the
model's chat template, or a JSON object `{"messages", "tools", "chat_template", "chat_template_kwargs",
"add_generation_prompt", "continue_final_message"}`), or the request parameter `prompt_token_ids` (a
list of token ids, or that list as JSON text); optional `sampling_parameters` (BYTES, a JSON object;
numbers may be strings, as tritonclient examples send them) and request parameters named like sampling
fields; the request parameter `lora` (or the sampling field `lora_name`, as Triton's vLLM backend
takes it) names an adapter. `max_tokens: null` means "up to the context length". Out: `text_output`
(BYTES) and response parameters `finish_reason`, `index` (when n > 1), `num_input_tokens` /
`num_output_tokens` (on a completion's last response), `logprobs` (a JSON list, when asked for) and
`prompt_logprobs` (a JSON list, on a completion's first response, when asked for); with the request
parameter `usage_per_response`, every response carries the token counts so far. The OpenAI and
generate routes speak this protocol; each backend turns the sampling fields into its own engine's
settings and validates them there.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..core.errors import InvalidInput
from ..core.params import parse_bool
from ..core.tensors import InferRequest, InferResponse, InferTensor
from ..models.adapters import LORA_PARAMETER
from . import vllm_tensors

# Sampling fields and their types: what request parameters may carry and how strings become numbers.
FLOAT_FIELDS = frozenset({"temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                          "frequency_penalty"})
# priority and truncate_prompt_tokens are request settings a backend applies before its sampler; best_of
# is only taken equal to n (the data plane's limits)
INT_FIELDS = frozenset({"n", "best_of", "max_tokens", "top_k", "seed", "logprobs", "min_tokens", "prompt_logprobs",
                        "priority", "truncate_prompt_tokens"})
BOOL_FIELDS = frozenset({"ignore_eos", "skip_special_tokens", "include_stop_str_in_output"})
LIST_FIELDS = frozenset({"stop", "stop_token_ids", "allowed_token_ids", "bad_words"})
# OpenAI's response_format {"type": "json_object" | "json_schema", ...}; vLLM's structured_outputs
# {"json" | "regex" | "choice" | "grammar" | "json_object": ...}; logit_bias {"token id": bias}
OBJECT_FIELDS = frozenset({"response_format", "structured_outputs", "logit_bias"})
STRING_FIELDS = frozenset({"lora_name"})
SAMPLING_FIELDS = FLOAT_FIELDS | INT_FIELDS | BOOL_FIELDS | LIST_FIELDS | OBJECT_FIELDS | STRING_FIELDS
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
TOKEN_IDS_PARAMETER = "prompt_token_ids"
VLLM_FLAGS = vllm_tensors.VLLM_FLAGS
USAGE_PARAMETER = "usage_per_response"  # true: num_input_tokens / num_output_tokens (so far) on every response


@dataclass
class ChatRequest:
    """A chat to render with the model's (or the given) chat template, as transformers'
    `apply_chat_template(messages, tools=..., **chat_template_kwargs)` takes it."""

    messages: list[dict]
    tools: list[dict] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict = field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool = False


@dataclass
class GenerateInputs:
    """What one request asks for, before a backend tokenizes it: exactly one of `text`, `chat` (checked
    messages) and `prompt_token_ids`, the sampling fields as given, and the adapter (`lora`, "" = base;
    `lora_field` is the request field that named it, for errors). The data plane checks the adapter
    and the limits (`limits`) before a backend sees it."""

    text: str | None
    chat: ChatRequest | None
    sampling: dict
    lora: str = ""
    prompt_token_ids: list[int] | None = None
    request_id: str = ""
    lora_field: str = "lora"

    @property
    def messages(self) -> list[dict] | None:
        return None if self.chat is None else self.chat.messages


def declare_generate_tensors(config) -> None:
    """Auto-complete: declare the protocol's tensors when config.pbtxt lists none."""
    from tritonclient.grpc import model_config_pb2 as pb

    if not config.input:
        # text_input is optional only because a chat request sends `messages` instead.
        for name in ("text_input", "messages", "sampling_parameters"):
            tensor = config.input.add(name=name, data_type=pb.TYPE_STRING, dims=[1])
            tensor.optional = True
    if not config.output:
        config.output.add(name="text_output", data_type=pb.TYPE_STRING, dims=[-1])


def read_generate_inputs(request: InferRequest) -> GenerateInputs:
    """The request's prompt (text, chat or token ids) and sampling fields; InvalidInput names the field at fault."""
    names = {t.name for t in request.inputs}
    token_ids = request.parameters.get(TOKEN_IDS_PARAMETER)
    if ("text_input" in names) + ("messages" in names) + (token_ids is not None) != 1:
        raise InvalidInput("text_input: give exactly one of 'text_input', 'messages' and 'prompt_token_ids'",
                           param="text_input")
    text = chat = None
    if "messages" in names:
        chat = chat_request(_json_input(request, "messages"))
    elif token_ids is not None:
        token_ids = prompt_token_ids(token_ids)
    else:
        text = first_string(request.input("text_input"))
    values = {k: v for k, v in request.parameters.items() if k in SAMPLING_FIELDS}
    if "sampling_parameters" in names:
        sampling = _json_input(request, "sampling_parameters")
        if not isinstance(sampling, dict):
            raise InvalidInput("sampling_parameters: must be a JSON object", param="sampling_parameters")
        values.update(sampling)
    lora = request.parameters.get(LORA_PARAMETER, "")  # the data plane has checked it is a loaded adapter
    return GenerateInputs(text, chat, {k: _coerce(k, v) for k, v in values.items()}, lora, token_ids)


def prompt_token_ids(value) -> list[int]:
    """A token-id prompt: a non-empty list of integers >= 0 (or that list as JSON text)."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if (not isinstance(value, list) or not value
            or any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in value)):
        raise InvalidInput("prompt: token ids must be a non-empty list of integers >= 0", param="prompt")
    return value


def chat_request(value) -> ChatRequest:
    """The `messages` tensor's JSON: a list of messages, or an object holding them and template options."""
    if not isinstance(value, dict):
        return ChatRequest(chat_messages(value))
    unknown = sorted(set(value) - {f for f in ChatRequest.__dataclass_fields__})
    if unknown:
        raise InvalidInput(f"messages: unknown chat field(s) {', '.join(unknown)}", param="messages")
    chat = ChatRequest(chat_messages(value.get("messages")))
    for name, kind in (("tools", list), ("chat_template", str), ("chat_template_kwargs", dict),
                       ("add_generation_prompt", bool), ("continue_final_message", bool)):
        if value.get(name) is not None:
            if not isinstance(value[name], kind):
                raise InvalidInput(f"{name}: must be a {kind.__name__}", param=name)
            setattr(chat, name, value[name])
    if chat.continue_final_message and chat.add_generation_prompt:
        raise InvalidInput("continue_final_message: cannot be used with add_generation_prompt: true",
                           param="continue_final_message")
    if chat.continue_final_message and chat.messages[-1]["role"] != "assistant":
        raise InvalidInput("continue_final_message: the last message must be the assistant's",
                           param="continue_final_message")
    return chat


def chat_messages(messages) -> list[dict]:
    """Checked chat messages: role, text content (OpenAI text parts joined) and, where given, `name`,
    an assistant's `tool_calls` (arguments as objects, as chat templates read them) and a tool
    message's `tool_call_id`."""
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages: must be a non-empty list of {role, content} objects", param="messages")
    plain = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            raise InvalidInput(f"messages: [{i}] needs a 'role', one of {', '.join(CHAT_ROLES)}", param="messages")
        checked = {"role": message["role"], "content": _content_text(message.get("content"), i)}
        for key in ("name", "tool_call_id"):
            if isinstance(message.get(key), str):
                checked[key] = message[key]
        if message.get("tool_calls"):
            checked["tool_calls"] = _tool_calls(message["tool_calls"], i)
        plain.append(checked)
    return plain


def _tool_calls(calls, i: int) -> list[dict]:
    if not isinstance(calls, list):
        raise InvalidInput(f"messages: [{i}].tool_calls must be a list", param="messages")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidInput(f"messages: [{i}].tool_calls need function.name", param="messages")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                pass  # a template gets the text as the client sent it
        out.append({"id": call.get("id", ""), "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    return out


def _content_text(content, i: int) -> str:
    """A message's text: a string, or OpenAI content parts of type text (joined)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise InvalidInput(f"messages: [{i}].content must be a string or a list of text parts", param="messages")


def _coerce(key: str, value):
    """Triton's vLLM examples send numbers as strings ("0.1"); turn those into numbers."""
    if not isinstance(value, str):
        return value
    try:
        if key in FLOAT_FIELDS:
            return float(value)
        if key in INT_FIELDS:
            return int(value)
    except ValueError:
        raise InvalidInput(f"{key}: not a number: {value!r}", param=key) from None
    if key in BOOL_FIELDS:
        return parse_bool(value, key)
    return value


def _json_input(request: InferRequest, name: str):
    try:
        return json.loads(first_string(request.input(name)))
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{name}: not JSON ({exc.msg})", param=name) from None


def first_string(tensor: InferTensor) -> str:
    value = tensor.data.reshape(-1)[0] if tensor.data.size else b""
    return value.decode() if isinstance(value, bytes) else str(value)


def text_response(request: InferRequest, model: tuple[str, str], text: str, parameters: dict) -> InferResponse:
    """One response of the protocol: `text_output` holding `text` (a delta or a whole text)."""
    out = InferTensor.from_numpy("text_output", np.array([text.encode()], dtype=np.object_))
    return InferResponse(model[0], model[1], [out], id=request.id, parameters=parameters)
