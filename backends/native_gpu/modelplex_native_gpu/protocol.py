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


@dataclass
class GenerateCall:
    """What one inference request asks the engine for."""

    prompt_ids: list[int]
    params: SamplingParams


def parse_request(request: InferRequest, tokenizer, max_model_len: int) -> GenerateCall:
    """Tensors and parameters -> prompt token ids and validated SamplingParams (InvalidInput naming the field)."""
    inputs = llm_protocol.read_generate_inputs(request)
    text = inputs.text if inputs.messages is None else render_chat(tokenizer, inputs.messages)
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    if not prompt_ids:
        raise InvalidInput("prompt: is empty", param="prompt")
    if len(prompt_ids) >= max_model_len:
        raise InvalidInput(f"prompt: {len(prompt_ids)} tokens; the context length (max_model_len) is {max_model_len}",
                           param="prompt")
    values = inputs.sampling
    if "max_tokens" in values and values["max_tokens"] is None:
        values["max_tokens"] = max_model_len - len(prompt_ids)
    try:
        return GenerateCall(prompt_ids, SamplingParams.from_dict(values))
    except InvalidRequestError as exc:
        raise InvalidInput(str(exc), param=exc.field) from None


def make_response(request: InferRequest, model: tuple[str, str], text: str, output: RequestOutput,
                  params: SamplingParams, tokenizer) -> InferResponse:
    """One response (a delta or a whole text) with its protocol parameters."""
    parameters = {}
    if params.n > 1:
        parameters["index"] = output.index
    if output.finished:
        parameters.update(llm_protocol.final_parameters(output.finish_reason, output.num_prompt_tokens,
                                           output.num_generated_tokens))
    if params.logprobs is not None:
        parameters["logprobs"] = json.dumps(_logprob_entries(output, params.logprobs, tokenizer))
    return llm_protocol.text_response(request, model, text, parameters)


def _logprob_entries(output: RequestOutput, k: int, tokenizer) -> list[dict]:
    """Per new token: its text and log-probability, and the k most likely alternatives."""
    entries = []
    for token_id, found in zip(output.new_token_ids, output.new_logprobs):
        top = sorted(found.items(), key=lambda item: -item[1])[:k]
        entries.append({"token": tokenizer.decode([token_id]), "logprob": found[token_id],
                        "top_logprobs": [{"token": tokenizer.decode([t]), "logprob": lp} for t, lp in top]})
    return entries
