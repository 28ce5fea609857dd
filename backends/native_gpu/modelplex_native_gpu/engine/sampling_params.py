"""SamplingParams: how one request picks tokens and when it stops; validated on construction."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..errors import InvalidRequestError
from .structured_output import check_response_format


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
        self.response_format = check_response_format(self.response_format)

    def _check_int(self, name: str, minimum: int):
        value = getattr(self, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise InvalidRequestError(name, f"must be an integer >= {minimum}, got {value!r}")

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
