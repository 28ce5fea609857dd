"""EngineRequest: one sequence's token ids, progress (`num_computed_tokens`) and status."""
from __future__ import annotations

import enum
import time
from typing import Any

from .sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


_FIRST_FINISHED = RequestStatus.FINISHED_STOPPED

FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class EngineRequest:
    """A prompt plus its generated tokens. `num_computed_tokens` catches up with `num_tokens`.

    Tokens at positions < num_computed_tokens have their K/V in the request's blocks.
    `block_hashes[i]` is the prefix-cache key of full block i (filled by the KVCacheManager).
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 eos_token_id: int | None = None, priority: int = 0, cache_salt: Any = None,
                 arrival_time: float | None = None, lora_id: int | None = None):
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.priority = priority
        self.cache_salt = cache_salt  # extra key in block hashes (e.g. an adapter id)
        self.lora_id = lora_id  # the LoRA adapter the request runs with (None: the base model)
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        # time.monotonic() when first scheduled and when its first token came (reported in outputs)
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.all_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        # Tokens sampled by a launched step but not yet read back (async scheduling): they count as computed
        # and as known to the scheduler, but all_token_ids does not hold them yet.
        self.num_output_placeholders = 0
        self.num_cached_tokens = 0  # prefix-cache hit length at first schedule
        self.block_hashes: list[tuple] = []
        self.status = RequestStatus.WAITING
        # Checked per step by the sampler (sampling_params are not changed after a request is made): rows with
        # neither logprobs, penalties nor logits processors (nor a grammar) stay on the sampler's fast path.
        self.has_plain_sampling = not (sampling_params.logprobs is not None or sampling_params.has_penalties
                                       or sampling_params.has_logits_processors)
        self.stop_reason: int | str | None = None
        self.num_preemptions = 0
        self.logprobs: list[dict[int, float]] = []
        self.generator: Any = None  # the sampler's per-request RNG when a seed is given
        self.grammar: Any = None  # an xgrammar GrammarMatcher when the output must follow a response_format
        self.bad_words: list[list[int]] = []  # token sequences the output may not complete
        # prompt position p + 1 -> {token: logprob} (the prompt's token first), when sampling_params asks
        self.prompt_logprobs: list[dict[int, float]] | None = (
            [] if sampling_params.prompt_logprobs is not None else None)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.all_token_ids[:self.num_prompt_tokens]

    @property
    def is_finished(self) -> bool:
        return self.status >= _FIRST_FINISHED  # RequestStatus.is_finished, without its lookups (per token)

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def append_token(self, token_id: int):
        self.all_token_ids.append(token_id)

    def sort_key(self) -> tuple:
        """Scheduling order: lower priority value first, then first come first served."""
        return (self.priority, self.arrival_time)

    def __repr__(self) -> str:
        return (f"EngineRequest({self.request_id!r}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, status={self.status.name})")
