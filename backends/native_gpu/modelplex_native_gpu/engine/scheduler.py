"""Scheduler: decides which requests run each step and how many tokens each advances.

One rule covers prefill, chunked prefill, prefix hits and decode: a request's
`num_computed_tokens` catches up with `num_tokens` within a per-step token budget.
Running decodes go first, then running partial prefills, then waiting requests.
When blocks run out, the newest (lowest-priority) running request is preempted and
later recomputed. The scheduler never touches a tensor: its output is a SchedulerOutput.
"""
from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass, field

from .kv_cache_manager import KVCacheManager
from .request import EngineRequest, RequestStatus

logger = logging.getLogger(__name__)


@dataclass
class SchedulerOutput:
    """The only message from scheduler to runner. Lists are aligned: request i runs
    `num_scheduled_tokens[i]` tokens starting at its `num_computed_tokens`."""

    requests: list[EngineRequest] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)
    block_tables: list[list[list[int]]] = field(default_factory=list)  # per request, one per KV-cache group
    preempted_request_ids: list[str] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)
    is_committed: bool = False  # Scheduler.commit has advanced the requests' progress

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.requests


class Scheduler:
    """FCFS (or priority, lower first) continuous batching over a KVCacheManager."""

    def __init__(self, kv_cache_manager: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, lora_admission=None):
        self.kv_cache_manager = kv_cache_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: list[EngineRequest] = []  # sorted by sort_key()
        self.running: list[EngineRequest] = []  # in admission order: the last is preempted first
        self.requests: dict[str, EngineRequest] = {}
        self._finished_ids: list[str] = []
        self.num_preemptions = 0
        self.lora_admission = lora_admission  # modelplex_multilora.LoRAAdmission when LoRA is on

    def add_request(self, request: EngineRequest):
        self.requests[request.request_id] = request
        self._enqueue(request)

    def _enqueue(self, request: EngineRequest):
        keys = [r.sort_key() for r in self.waiting]
        self.waiting.insert(bisect.bisect_right(keys, request.sort_key()), request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_request_ids=self._finished_ids)
        self._finished_ids = []
        budget = self.max_num_batched_tokens
        decodes, prefills = [], []  # (request, tokens it has left to compute)
        for r in self.running:
            num_left = r.num_tokens + r.num_output_placeholders - r.num_computed_tokens
            if num_left == 1 and not (r.num_output_placeholders and self._is_last_token_pending(r)):
                decodes.append((r, 1))
            elif num_left > 1:
                prefills.append((r, num_left))
        allocate, running = self.kv_cache_manager.allocate_slots, RequestStatus.RUNNING
        for request, num_left in decodes + prefills:
            if budget == 0:
                break
            if request.status != running:  # preempted earlier in this loop
                continue
            num_new = min(num_left, budget)
            if not allocate(request, num_new) and not self._preempt_until_fits(request, num_new, out):
                continue
            self._add(out, request, num_new)
            budget -= num_new
        self._schedule_waiting(out, budget)
        return out

    def _is_last_token_pending(self, request: EngineRequest) -> bool:
        """The token still on its way ends the request by length: nothing more to schedule for it."""
        num_output = request.num_output_tokens + request.num_output_placeholders
        return (num_output >= request.sampling_params.max_tokens
                or request.num_tokens + request.num_output_placeholders >= self.max_model_len)

    def _preempt_until_fits(self, request: EngineRequest, num_new: int, out: SchedulerOutput) -> bool:
        """Preempt the lowest-priority newest running request until `request`'s allocation fits."""
        while True:
            victim = max(self.running, key=lambda r: (r.priority, self.running.index(r)))
            self._preempt(victim, out)
            if victim is request:
                return False
            if self.kv_cache_manager.allocate_slots(request, num_new):
                return True

    def _preempt(self, request: EngineRequest, out: SchedulerOutput):
        logger.debug("preempting %s", request.request_id)
        self.running.remove(request)
        if request in out.requests:  # already scheduled this step: unschedule it
            i = out.requests.index(request)
            del out.requests[i], out.num_scheduled_tokens[i], out.block_tables[i]
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted_request_ids.append(request.request_id)
        self._enqueue(request)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int):
        lora, held_back = self.lora_admission, []
        if lora is not None:
            lora.begin_step(self.running)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if request.num_output_placeholders:  # preempted with a token in flight: admitted once it is known
                break
            if lora is not None and not lora.admit(request):  # its adapter has no device slot yet
                held_back.append(self.waiting.pop(0))
                continue
            hits, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_hit_tokens, budget)
            if not self.kv_cache_manager.allocate_slots(request, num_new, hits):
                break  # wait for running requests to free blocks; never preempt for a newcomer
            self.kv_cache_manager.record_prefix_lookup(request.num_tokens, num_hit_tokens)
            self.waiting.pop(0)
            request.num_computed_tokens = num_hit_tokens
            if request.num_preemptions == 0:
                request.num_cached_tokens = num_hit_tokens
            request.status = RequestStatus.RUNNING
            if request.first_scheduled_time is None:
                request.first_scheduled_time = time.monotonic()
            self.running.append(request)
            self._add(out, request, num_new)
            budget -= num_new
        self.waiting[:0] = held_back  # still ahead of everything behind them

    def _add(self, out: SchedulerOutput, request: EngineRequest, num_new: int):
        out.requests.append(request)
        out.num_scheduled_tokens.append(num_new)
        out.block_tables.append(self.kv_cache_manager.block_tables(request.request_id))

    def commit(self, out: SchedulerOutput) -> None:
        """The step is launched: advance each request's progress, and count the token each request whose
        scheduled tokens reach its end will sample as a placeholder until update_from_output brings it.
        The next step can then be scheduled before this one's tokens are read back (async scheduling)."""
        for request, num_new in zip(out.requests, out.num_scheduled_tokens):
            samples = request.num_computed_tokens + num_new == request.num_tokens + request.num_output_placeholders
            request.num_computed_tokens += num_new
            request.num_output_placeholders += samples
        out.is_committed = True

    def update_from_output(self, out: SchedulerOutput, sampled_token_ids: list[int | None]) -> list[EngineRequest]:
        """Append sampled tokens (committing the step first if it was not); returns the requests that got a
        new token. `sampled_token_ids[i]` is None for a request whose prefill chunk did not reach its end.
        A request that finished while the step ran (abort, a stop string, or its previous token under async
        scheduling) drops its token."""
        if not out.is_committed:
            self.commit(out)
        updated = []
        for request, token_id in zip(out.requests, sampled_token_ids):
            if token_id is None:
                continue
            request.num_output_placeholders -= 1
            if request.is_finished:
                continue
            request.append_token(token_id)
            if self._check_stop(request, token_id):
                self._free(request)
            updated.append(request)
        return updated

    def _check_stop(self, request: EngineRequest, token_id: int) -> bool:
        """Finish the request if `token_id` (just appended) ends it; returns whether it did."""
        params = request.sampling_params
        if not params.ignore_eos and token_id == request.eos_token_id:
            request.status = RequestStatus.FINISHED_STOPPED
        elif token_id in params.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = token_id
        elif request.num_output_tokens >= params.max_tokens or request.num_tokens >= self.max_model_len:
            request.status = RequestStatus.FINISHED_LENGTH
        else:
            return False
        return True

    def finish_request(self, request_id: str, status: RequestStatus) -> EngineRequest | None:
        """Finish from outside (abort, stop string); frees its blocks at once."""
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return None
        if request in self.running:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        self._free(request)
        return request

    def _free(self, request: EngineRequest):
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:  # preempted while its last token was in flight
            self.waiting.remove(request)
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self._finished_ids.append(request.request_id)
