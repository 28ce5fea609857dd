"""The native_gpu backend's side of the LLM tensor protocol (`modelplex.llm.tensor_protocol`): a request
becomes prompt token ids and validated SamplingParams; engine outputs become protocol responses."""
from __future__ import annotations

import json
from dataclasses import dataclass

from modelplex import InferRequest, InferResponse, InvalidInput, llm_protocol

from .chat_template import render_chat
from .engine.outputs import RequestOutput
from .engine.sampling_params import SamplingParams
from .errors import InvalidRequestError

# Protocol fields that are request settings, not SamplingParams
REQUEST_FIELDS = ("priority", "truncate_prompt_tokens", "lora_name")


@dataclass
class GenerateCall:
    """What one inference request asks the engine for."""

    prompt_ids: list[int]
    params: SamplingParams
    priority: int = 0
    lora_name: str | None = None  # Triton's vLLM backend names the adapter among the sampling fields
    prompt_text: str | None = None  # the text prompt (or rendered chat); None for token ids


def parse_request(request: InferRequest, tokenizer, max_model_len: int, vocab_size: int | None = None) -> GenerateCall:
    """Tensors and parameters -> prompt token ids and validated SamplingParams (InvalidInput naming the field)."""
    inputs = llm_protocol.read_generate_inputs(request)
    values = inputs.sampling
    settings = {name: values.pop(name) for name in REQUEST_FIELDS if name in values}
    text = None
    if inputs.prompt_token_ids is not None:
        prompt_ids = inputs.prompt_token_ids
        if vocab_size is not None and max(prompt_ids) >= vocab_size:
            raise InvalidInput(f"prompt: token ids must be in [0, {vocab_size})", param="prompt")
    else:
        text = inputs.text if inputs.chat is None else render_chat(tokenizer, inputs.chat)
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    prompt_ids = truncate(prompt_ids, settings.get("truncate_prompt_tokens"), max_model_len)
    if not prompt_ids:
        raise InvalidInput("prompt: is empty", param="prompt")
    if len(prompt_ids) >= max_model_len:
        raise InvalidInput(f"prompt: {len(prompt_ids)} tokens; the context length (max_model_len) is {max_model_len}",
                           param="prompt")
    if "max_tokens" in values and values["max_tokens"] is None:
        values["max_tokens"] = max_model_len - len(prompt_ids)
    priority = settings.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise InvalidInput(f"priority: must be an integer, got {priority!r}", param="priority")
    lora_name = settings.get("lora_name")
    if lora_name is not None and not isinstance(lora_name, str):
        raise InvalidInput("lora_name: must be a string", param="lora_name")
    try:
        return GenerateCall(prompt_ids, SamplingParams.from_dict(values), priority, lora_name or None, text)
    except InvalidRequestError as exc:
        raise InvalidInput(str(exc), param=exc.field) from None


def truncate(prompt_ids: list[int], keep: int | None, max_model_len: int) -> list[int]:
    """vLLM's truncate_prompt_tokens: keep the last `keep` tokens (-1: the context length's worth)."""
    if keep is None:
        return prompt_ids
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < -1 or keep == 0:
        raise InvalidInput(f"truncate_prompt_tokens: must be -1 or an integer >= 1, got {keep!r}",
                           param="truncate_prompt_tokens")
    if keep > max_model_len:
        raise InvalidInput(f"truncate_prompt_tokens: {keep} exceeds max_model_len {max_model_len}",
                           param="truncate_prompt_tokens")
    keep = max_model_len - 1 if keep == -1 else keep
    return prompt_ids[-keep:]


def make_response(request: InferRequest, model: tuple[str, str], text: str, output: RequestOutput,
                  params: SamplingParams, tokenizer) -> InferResponse:
    """One response (a delta or a whole text) with its protocol parameters."""
    parameters = {}
    if params.n > 1:
        parameters["index"] = output.index
    if output.finished:
        parameters.update(llm_protocol.final_parameters(output.finish_reason, output.num_prompt_tokens,
                                           output.num_generated_tokens))
    elif request.parameters.get(llm_protocol.USAGE_PARAMETER):
        parameters.update(num_input_tokens=output.num_prompt_tokens, num_output_tokens=output.num_generated_tokens)
    if params.logprobs is not None:
        parameters["logprobs"] = json.dumps(_logprob_entries(output, params.logprobs, tokenizer))
    if output.prompt_logprobs is not None:
        parameters["prompt_logprobs"] = json.dumps(prompt_logprob_entries(output.prompt_logprobs,
                                                                          params.prompt_logprobs, tokenizer))
    return llm_protocol.text_response(request, model, text, parameters)


def prompt_logprob_entries(found: list[dict[int, float]], k: int, tokenizer) -> list[dict]:
    """Per prompt token: as `_logprob_entries` (its own token is each dict's first key; the first has None)."""
    entries = []
    for entry in found:
        token_id = next(iter(entry))
        top = [] if entry[token_id] is None else sorted(entry.items(), key=lambda item: -item[1])[:k]
        entries.append({"token": tokenizer.decode([token_id]), "token_id": token_id, "logprob": entry[token_id],
                        "top_logprobs": [{"token": tokenizer.decode([t]), "token_id": t, "logprob": lp}
                                         for t, lp in top]})
    return entries


def _logprob_entries(output: RequestOutput, k: int, tokenizer) -> list[dict]:
    """Per new token: its text and log-probability, and the k most likely alternatives."""
    entries = []
    for token_id, found in zip(output.new_token_ids, output.new_logprobs):
        top = sorted(found.items(), key=lambda item: -item[1])[:k]
        entries.append({"token": tokenizer.decode([token_id]), "logprob": found[token_id],
                        "top_logprobs": [{"token": tokenizer.decode([t]), "logprob": lp} for t, lp in top]})
    return entries
