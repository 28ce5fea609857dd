"""RequestOutput: what the engine reports for a request after a step (incremental plus totals)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestOutput:
    """One completion's progress. `index` tells the n>1 completions of a request apart."""

    request_id: str
    index: int
    new_token_ids: list[int]
    text_delta: str
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0
    new_logprobs: list[dict[int, float]] = field(default_factory=list)
    # With the first token, when asked for: per prompt token, its logprob (None for the first) and alternatives
    prompt_logprobs: list[dict[int, float | None]] | None = None
    # time.monotonic() of arrival, first scheduling (prefill starts) and first token (prefill done)
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
