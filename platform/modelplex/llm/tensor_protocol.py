"""The tensor protocol of text-generation models (Triton's vLLM-backend tensors, extended), for every LLM backend.

In: `text_input` (BYTES) or `messages` (BYTES, a JSON list of chat messages the backend renders with the
model's chat template), optional `sampling_parameters` (BYTES, a JSON object; numbers may be strings,
as tritonclient examples send them) and request parameters named like sampling fields; the request
parameter `lora` names an adapter. `max_tokens: null` means "up to the context length". Out:
`text_output` (BYTES) and response parameters `finish_reason`, `index` (when n > 1),
`num_input_tokens` / `num_output_tokens` (on a completion's last response) and `logprobs` (a JSON
list, when asked for). The OpenAI and generate routes speak this protocol; each backend turns the
sampling fields into its own engine's settings and validates them there.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..core.errors import InvalidInput
from ..core.params import parse_bool
from ..core.tensors import InferRequest, InferResponse, InferTensor
from ..models.adapters import LORA_PARAMETER

# Sampling fields and their types: what request parameters may carry and how strings become numbers.
FLOAT_FIELDS = frozenset({"temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                          "frequency_penalty"})
INT_FIELDS = frozenset({"n", "max_tokens", "top_k", "seed", "logprobs"})
BOOL_FIELDS = frozenset({"ignore_eos", "skip_special_tokens"})
LIST_FIELDS = frozenset({"stop", "stop_token_ids"})
OBJECT_FIELDS = frozenset({"response_format"})  # OpenAI's {"type": "json_object" | "json_schema", ...}
SAMPLING_FIELDS = FLOAT_FIELDS | INT_FIELDS | BOOL_FIELDS | LIST_FIELDS | OBJECT_FIELDS
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class GenerateInputs:
    """What one request asks for, before a backend tokenizes it: exactly one of `text` and `messages`
    (checked {role, content: str} dicts), the sampling fields as given, and the adapter (`lora`, "" = base)."""

    text: str | None
    messages: list[dict] | None
    sampling: dict
    lora: str = ""


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
    """The request's prompt (or messages) and sampling fields; InvalidInput names the field at fault."""
    names = {t.name for t in request.inputs}
    if ("text_input" in names) == ("messages" in names):
        raise InvalidInput("text_input: give exactly one of 'text_input' and 'messages'", param="text_input")
    text = messages = None
    if "messages" in names:
        messages = chat_messages(_json_input(request, "messages"))
    else:
        text = first_string(request.input("text_input"))
    values = {k: v for k, v in request.parameters.items() if k in SAMPLING_FIELDS}
    if "sampling_parameters" in names:
        sampling = _json_input(request, "sampling_parameters")
        if not isinstance(sampling, dict):
            raise InvalidInput("sampling_parameters: must be a JSON object", param="sampling_parameters")
        values.update(sampling)
    lora = request.parameters.get(LORA_PARAMETER, "")  # the data plane has checked it is a loaded adapter
    return GenerateInputs(text, messages, {k: _coerce(k, v) for k, v in values.items()}, lora)


def chat_messages(messages) -> list[dict]:
    """Checked chat messages as {role, content} with text content (OpenAI text parts joined)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages: must be a non-empty list of {role, content} objects", param="messages")
    plain = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            raise InvalidInput(f"messages: [{i}] needs a 'role', one of {', '.join(CHAT_ROLES)}", param="messages")
        plain.append({"role": message["role"], "content": _content_text(message.get("content"), i)})
    return plain


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


def final_parameters(finish_reason: str, num_input_tokens: int, num_output_tokens: int) -> dict:
    """The response parameters of a completion's last response."""
    return {"finish_reason": finish_reason, "num_input_tokens": num_input_tokens,
            "num_output_tokens": num_output_tokens}
