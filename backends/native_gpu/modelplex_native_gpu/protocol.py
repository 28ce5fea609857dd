"""The request/response protocol of the native_gpu backend (Triton's vLLM-backend tensors, extended).

In: `text_input` (BYTES) or `messages` (BYTES, a JSON list of chat messages, rendered with the
model's chat template), optional `sampling_parameters` (BYTES, a JSON object; numbers may be
strings, as tritonclient examples send them) and request parameters named like sampling fields.
`max_tokens: null` means "up to the context length". Out: `text_output` (BYTES) and response
parameters `finish_reason`, `index` (when n > 1), `num_input_tokens` / `num_output_tokens` (on a
completion's last response) and `logprobs` (a JSON list, when asked for).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np
from modelplex import InferRequest, InferResponse, InferTensor, InvalidInput

from .engine.outputs import RequestOutput
from .engine.sampling_params import SamplingParams
from .errors import InvalidRequestError

_FIELDS = {f.name: f for f in dataclasses.fields(SamplingParams)}
_FLOATS = {"temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"}
_INTS = {"n", "max_tokens", "top_k", "seed", "logprobs"}
_BOOLS = {"ignore_eos", "skip_special_tokens"}
_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class GenerateCall:
    """What one inference request asks the engine for."""

    prompt_ids: list[int]
    params: SamplingParams


def parse_request(request: InferRequest, tokenizer, max_model_len: int) -> GenerateCall:
    """Tensors and parameters -> prompt token ids and validated SamplingParams (InvalidInput naming the field)."""
    names = {t.name for t in request.inputs}
    if ("text_input" in names) == ("messages" in names):
        raise InvalidInput("text_input: give exactly one of 'text_input' and 'messages'")
    if "messages" in names:
        text = render_chat(tokenizer, _json_input(request, "messages"))
    else:
        text = first_string(request.input("text_input"))
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    if not prompt_ids:
        raise InvalidInput("prompt: is empty")
    if len(prompt_ids) >= max_model_len:
        raise InvalidInput(f"prompt: {len(prompt_ids)} tokens; the context length (max_model_len) is {max_model_len}")
    values = {k: v for k, v in request.parameters.items() if k in _FIELDS}
    if "sampling_parameters" in names:
        sampling = _json_input(request, "sampling_parameters")
        if not isinstance(sampling, dict):
            raise InvalidInput("sampling_parameters: must be a JSON object")
        values.update(sampling)
    values = {k: _coerce(k, v) for k, v in values.items()}
    if "max_tokens" in values and values["max_tokens"] is None:
        values["max_tokens"] = max_model_len - len(prompt_ids)
    try:
        return GenerateCall(prompt_ids, SamplingParams.from_dict(values))
    except InvalidRequestError as exc:
        raise InvalidInput(str(exc)) from None


def render_chat(tokenizer, messages) -> str:
    """The model's chat template over checked messages, ending with the assistant's turn opening."""
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages: must be a non-empty list of {role, content} objects")
    plain = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise InvalidInput(f"messages: [{i}] needs a 'role', one of {', '.join(_ROLES)}")
        plain.append({"role": message["role"], "content": _content_text(message.get("content"), i)})
    if tokenizer.chat_template is None:
        raise InvalidInput("messages: this model has no chat template; send text_input")
    try:
        return tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # noqa: BLE001 - a template may raise anything (jinja raise_exception)
        raise InvalidInput(f"messages: the chat template refused them: {exc}") from None


def _content_text(content, i: int) -> str:
    """A message's text: a string, or OpenAI content parts of type text (joined)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise InvalidInput(f"messages: [{i}].content must be a string or a list of text parts")


def _coerce(key: str, value):
    """Triton's vLLM examples send numbers as strings ("0.1"); turn those into numbers."""
    if not isinstance(value, str) or key not in _FIELDS:
        return value
    try:
        if key in _FLOATS:
            return float(value)
        if key in _INTS:
            return int(value)
    except ValueError:
        raise InvalidInput(f"{key}: not a number: {value!r}") from None
    if key in _BOOLS:
        return value.strip().lower() in ("1", "true", "yes", "on")
    return value


def _json_input(request: InferRequest, name: str):
    try:
        return json.loads(first_string(request.input(name)))
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{name}: not JSON ({exc.msg})") from None


def first_string(tensor: InferTensor) -> str:
    value = tensor.data.reshape(-1)[0] if tensor.data.size else b""
    return value.decode() if isinstance(value, bytes) else str(value)


def make_response(request: InferRequest, model: tuple[str, str], text: str, output: RequestOutput,
                  params: SamplingParams, tokenizer) -> InferResponse:
    """One response (a delta or a whole text) with its protocol parameters."""
    parameters = {}
    if params.n > 1:
        parameters["index"] = output.index
    if output.finished:
        parameters.update(finish_reason=output.finish_reason, num_input_tokens=output.num_prompt_tokens,
                          num_output_tokens=output.num_generated_tokens)
    if params.logprobs is not None:
        parameters["logprobs"] = json.dumps(_logprob_entries(output, params.logprobs, tokenizer))
    out = InferTensor.from_numpy("text_output", np.array([text.encode()], dtype=np.object_))
    return InferResponse(model[0], model[1], [out], id=request.id, parameters=parameters)


def _logprob_entries(output: RequestOutput, k: int, tokenizer) -> list[dict]:
    """Per new token: its text and log-probability, and the k most likely alternatives."""
    entries = []
    for token_id, found in zip(output.new_token_ids, output.new_logprobs):
        top = sorted(found.items(), key=lambda item: -item[1])[:k]
        entries.append({"token": tokenizer.decode([token_id]), "logprob": found[token_id],
                        "top_logprobs": [{"token": tokenizer.decode([t]), "logprob": lp} for t, lp in top]})
    return entries
