"""SamplingParams: how one request picks tokens and when it stops; validated on construction."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..errors import InvalidRequestError
from .structured_output import check_response_format, check_structured_outputs, response_format_constraint

MAX_LOGIT_BIAS = 100.0


@dataclass
class SamplingParams:
    """Per-request decoding settings. temperature 0 means greedy; top_k 0 / top_p 1 / min_p 0 disable."""

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    response_format: dict | None = None  # OpenAI's {"type": "json_object" | "json_schema", ...}
    # vLLM's StructuredOutputsParams: exactly one of json, regex, choice, grammar, json_object
    structured_outputs: dict | None = None
    include_stop_str_in_output: bool = False
    min_tokens: int = 0  # EOS and stop_token_ids are masked (stop strings ignored) until this many tokens
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (clamped to [-100, 100])
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    bad_words: list[str] = field(default_factory=list)  # never completed (their last token is masked)
    prompt_logprobs: int | None = None  # log-probabilities of the prompt's tokens (+ this many alternatives)

    MAX_LOGPROBS = 20

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self._check_int("n", 1)
        self._check_int("max_tokens", 1)
        self._check_int("top_k", 0)
        if self.temperature < 0:
            raise InvalidRequestError("temperature", f"must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise InvalidRequestError("min_p", f"must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise InvalidRequestError("repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise InvalidRequestError(name, f"must be in [-2, 2], got {getattr(self, name)}")
        if self.logprobs is not None and not 0 <= self.logprobs <= self.MAX_LOGPROBS:
            raise InvalidRequestError("logprobs", f"must be in [0, {self.MAX_LOGPROBS}], got {self.logprobs}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop", "must be non-empty strings")
        if self.seed is not None and not isinstance(self.seed, int):
            raise InvalidRequestError("seed", f"must be an integer, got {self.seed!r}")
        self._check_int("min_tokens", 0)
        if self.prompt_logprobs is not None and not (isinstance(self.prompt_logprobs, int)
                                                     and 0 <= self.prompt_logprobs <= self.MAX_LOGPROBS):
            raise InvalidRequestError("prompt_logprobs", f"must be in [0, {self.MAX_LOGPROBS}], "
                                                         f"got {self.prompt_logprobs!r}")
        self.stop_token_ids = _token_ids("stop_token_ids", self.stop_token_ids)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _token_ids("allowed_token_ids", self.allowed_token_ids)
            if not self.allowed_token_ids:
                raise InvalidRequestError("allowed_token_ids", "must not be empty")
        self.logit_bias = _logit_bias(self.logit_bias)
        if not isinstance(self.bad_words, list) or any(not isinstance(w, str) or not w.strip() for w in self.bad_words):
            raise InvalidRequestError("bad_words", "must be a list of non-blank strings")
        self.response_format = check_response_format(self.response_format)
        self.structured_outputs = check_structured_outputs(self.structured_outputs)
        if self.response_format is not None and self.structured_outputs is not None:
            raise InvalidRequestError("structured_outputs", "give either response_format or structured outputs")

    def _check_int(self, name: str, minimum: int):
        value = getattr(self, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise InvalidRequestError(name, f"must be an integer >= {minimum}, got {value!r}")

    @property
    def constraint(self) -> dict | None:
        """What the output must follow (structured_outputs' shape), from either field."""
        if self.structured_outputs is not None:
            return self.structured_outputs
        if self.response_format is None:
            return None
        return response_format_constraint(self.response_format)

    @property
    def has_logits_processors(self) -> bool:
        return bool(self.logit_bias or self.allowed_token_ids is not None or self.min_tokens or self.bad_words)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0

    @classmethod
    def from_dict(cls, values: dict) -> SamplingParams:
        """Build from untrusted key/values; an unknown key is an error naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        for key in values:
            if key not in known:
                raise InvalidRequestError(key, "unknown sampling parameter")
        try:
            return cls(**values)
        except TypeError as exc:  # e.g. a string where a number belongs
            raise InvalidRequestError("sampling_params", str(exc)) from exc


def _token_ids(name: str, values) -> list[int]:
    if not isinstance(values, list) or any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in values):
        raise InvalidRequestError(name, "must be a list of token ids (integers >= 0)")
    return values


def _logit_bias(values) -> dict[int, float] | None:
    """OpenAI's {"token id": bias} (JSON keys are strings) as {id: bias in [-100, 100]}."""
    if not values:
        return None
    if not isinstance(values, dict):
        raise InvalidRequestError("logit_bias", "must be an object mapping token ids to biases")
    out = {}
    for key, bias in values.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise InvalidRequestError("logit_bias", f"key {key!r} is not a token id") from None
        if token < 0 or isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise InvalidRequestError("logit_bias", f"needs token ids >= 0 and numeric biases, got {key!r}: {bias!r}")
        out[token] = max(-MAX_LOGIT_BIAS, min(MAX_LOGIT_BIAS, float(bias)))
    return out
