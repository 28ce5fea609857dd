"""The protocol's sampling fields (`modelplex.llm.tensor_protocol`) as an `openvino_genai.GenerationConfig`.

Defaults are the native engine's (max_tokens 16, temperature 1). What OpenVINO GenAI cannot do is
refused with the field named: `min_p`, log-probabilities of alternatives (it reports only the
chosen token's, so `logprobs` must be 0), and a `response_format` other than text (not wired to
OpenVINO GenAI's structured output yet).
"""
from __future__ import annotations

from modelplex import llm_protocol

DEFAULT_MAX_TOKENS = 16


class SamplingError(ValueError):
    """A sampling field OpenVINO GenAI cannot honour: `field` names it; the message starts with it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


# Protocol fields OpenVINO GenAI has no counterpart for (or modelplex does not wire yet): refused when set
UNAVAILABLE = {"logit_bias": {}, "allowed_token_ids": [], "bad_words": [], "prompt_logprobs": None,
               "structured_outputs": {}, "truncate_prompt_tokens": None, "priority": 0, "lora_name": None}


def _typed(key: str, value):
    if key in llm_protocol.FLOAT_FIELDS and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise SamplingError(key, f"must be a number, got {value!r}")
    if key in llm_protocol.INT_FIELDS and (isinstance(value, bool) or not isinstance(value, int)):
        raise SamplingError(key, f"must be an integer, got {value!r}")
    if key in llm_protocol.BOOL_FIELDS and not isinstance(value, bool):
        raise SamplingError(key, f"must be true or false, got {value!r}")
    return value


def generation_config(sampling: dict, num_prompt_tokens: int, max_model_len: int, eos_token_id: int):
    """A validated GenerationConfig; SamplingError names the field it refuses."""
    import openvino_genai as og

    for key in sampling:
        if key not in llm_protocol.SAMPLING_FIELDS:
            raise SamplingError(key, "unknown sampling parameter")
    values = {k: _typed(k, v) for k, v in sampling.items() if v is not None or k != "max_tokens"}
    config = og.GenerationConfig()
    config.eos_token_id = eos_token_id
    room = max_model_len - num_prompt_tokens
    max_tokens = room if "max_tokens" in sampling and sampling["max_tokens"] is None else values.get(
        "max_tokens", DEFAULT_MAX_TOKENS)
    if max_tokens < 1:
        raise SamplingError("max_tokens", f"must be an integer >= 1, got {max_tokens}")
    config.max_new_tokens = min(max_tokens, room)
    temperature = values.get("temperature", 1.0)
    if temperature < 0:
        raise SamplingError("temperature", f"must be >= 0, got {temperature}")
    config.do_sample = temperature > 0
    if config.do_sample:
        config.temperature = temperature
        config.top_p = _in_range(values, "top_p", 1.0, 0, 1, low_open=True)
        if values.get("top_k", 0) < 0:
            raise SamplingError("top_k", f"must be >= 0, got {values['top_k']}")
        if values.get("top_k", 0):
            config.top_k = values["top_k"]
        if "seed" in values:
            config.rng_seed = values["seed"]
    if (values.get("response_format") or {}).get("type", "text") != "text":
        raise SamplingError("response_format", "the OpenVINO backend answers only with text so far")
    if values.get("min_p", 0.0) != 0.0:
        raise SamplingError("min_p", "OpenVINO GenAI has no min-p sampling; leave it at 0")
    for key, default in UNAVAILABLE.items():
        if values.get(key, default) not in (default, None):
            raise SamplingError(key, "not available from OpenVINO GenAI")
    if values.get("min_tokens", 0) < 0:
        raise SamplingError("min_tokens", f"must be >= 0, got {values['min_tokens']}")
    config.min_new_tokens = values.get("min_tokens", 0)
    config.include_stop_str_in_output = values.get("include_stop_str_in_output", False)
    config.repetition_penalty = values.get("repetition_penalty", 1.0)
    if config.repetition_penalty <= 0:
        raise SamplingError("repetition_penalty", f"must be > 0, got {config.repetition_penalty}")
    config.presence_penalty = _in_range(values, "presence_penalty", 0.0, -2, 2)
    config.frequency_penalty = _in_range(values, "frequency_penalty", 0.0, -2, 2)
    n = values.get("n", 1)
    if n < 1:
        raise SamplingError("n", f"must be an integer >= 1, got {n}")
    if n > 1 and not config.do_sample:
        raise SamplingError("n", "more than one completion needs sampling (temperature > 0); greedy ones are equal")
    config.num_return_sequences = n
    stop = values.get("stop", [])
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or any(not isinstance(s, str) or not s for s in stop):
        raise SamplingError("stop", "must be non-empty strings")
    config.stop_strings = set(stop)
    stop_ids = values.get("stop_token_ids", [])
    if not isinstance(stop_ids, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in stop_ids):
        raise SamplingError("stop_token_ids", "must be a list of integers")
    config.stop_token_ids = set(stop_ids) | {eos_token_id}
    config.ignore_eos = values.get("ignore_eos", False)
    if values.get("logprobs") not in (None, 0):
        raise SamplingError("logprobs", "OpenVINO GenAI reports only the chosen token's log-probability; ask for 0 "
                            "alternatives")
    if "logprobs" in values:
        config.logprobs = 1  # OpenVINO GenAI's "1" is the chosen token's log-probability
    return config


def _in_range(values: dict, key: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = values.get(key, default)
    if value > high or value < low or (low_open and value == low):
        raise SamplingError(key, f"must be in {'(' if low_open else '['}{low}, {high}], got {value}")
    return value
