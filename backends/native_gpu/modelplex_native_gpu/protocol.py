"""The native_gpu backend's side of the typed LLM contract (`modelplex.llm.contract`): `GenerateInputs`
become prompt token ids and validated SamplingParams (on a worker thread: tokenizing and chat templates
never run on the event loop); engine outputs become `TextChunk`s."""
from __future__ import annotations

from dataclasses import dataclass

from modelplex import GenerateInputs, InvalidInput, TextChunk, TokenLogprob

from .chat_template import render_chat
from .engine.outputs import RequestOutput
from .engine.sampling_params import SamplingParams
from .errors import InvalidRequestError

# Protocol fields that are request settings, not SamplingParams (best_of: the host has checked it equals n)
REQUEST_FIELDS = ("priority", "truncate_prompt_tokens", "best_of")


@dataclass
class GenerateCall:
    """What one inference request asks the engine for."""

    prompt_ids: list[int]
    params: SamplingParams
    priority: int = 0


def parse_inputs(inputs: GenerateInputs, tokenizer, max_model_len: int, vocab_size: int | None = None) -> GenerateCall:
    """Inputs -> prompt token ids and validated SamplingParams (InvalidInput naming the field). Blocking:
    it tokenizes (call it on a worker thread)."""
    values = dict(inputs.sampling)
    settings = {name: values.pop(name) for name in REQUEST_FIELDS if name in values}
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
    try:
        return GenerateCall(prompt_ids, SamplingParams.from_dict(values), priority)
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


def text_chunk(output: RequestOutput, params: SamplingParams, tokenizer, token_ids: list[int],
               logprobs: list[dict[int, float]]) -> TextChunk:
    """One chunk: the output's text delta with `token_ids` (this output's and any held back since the
    last chunk) and their log-probabilities, when asked for."""
    chunk = TextChunk(output.text_delta, token_ids, output.index, finish_reason=output.finish_reason,
                      num_prompt_tokens=output.num_prompt_tokens, num_output_tokens=output.num_generated_tokens,
                      num_cached_tokens=output.num_cached_tokens)
    if params.logprobs is not None:
        chunk.logprobs = token_logprobs(token_ids, logprobs, params.logprobs, tokenizer)
    if output.prompt_logprobs is not None:
        chunk.prompt_logprobs = prompt_logprobs(output.prompt_logprobs, params.prompt_logprobs, tokenizer)
    return chunk


def prompt_logprobs(found: list[dict[int, float]], k: int, tokenizer) -> list[TokenLogprob]:
    """Per prompt token (its own token is each dict's first key; the first has None): it and k alternatives."""
    entries = []
    for entry in found:
        token_id = next(iter(entry))
        top = [] if entry[token_id] is None else sorted(entry.items(), key=lambda item: -item[1])[:k]
        entries.append(TokenLogprob(tokenizer.decode([token_id]), entry[token_id], token_id,
                                    tuple(TokenLogprob(tokenizer.decode([t]), lp, t) for t, lp in top)))
    return entries


def token_logprobs(token_ids: list[int], found: list[dict[int, float]], k: int, tokenizer) -> list[TokenLogprob]:
    """Per new token: its text and log-probability, and the k most likely alternatives."""
    entries = []
    for token_id, alternatives in zip(token_ids, found):
        top = sorted(alternatives.items(), key=lambda item: -item[1])[:k]
        entries.append(TokenLogprob(tokenizer.decode([token_id]), alternatives[token_id], token_id,
                                    tuple(TokenLogprob(tokenizer.decode([t]), lp, t) for t, lp in top)))
    return entries
