"""LLMEngine: the in-process engine loop. One step = schedule, run the model, update, emit outputs."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from modelplex import NotFound

from ..config import EngineConfig
from ..dtype_rule import choose_dtype
from ..errors import AdapterNotFoundError, InvalidRequestError
from ..loader import LoadedWeights, load_weights
from ..loader.tokenizer import load_tokenizer
from .detokenizer import IncrementalDetokenizer
from .kv_cache_manager import KVCacheManager
from .logits_processors import bad_word_ids
from .model_runner import ModelRunner, ModelRunnerConfig
from .outputs import RequestOutput
from .request import EngineRequest, RequestStatus
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .structured_output import StructuredOutputs, constraint_field
from .thread_governor import ThreadGovernor

logger = logging.getLogger(__name__)


def resolve_device(config: EngineConfig) -> str:
    return config.device or ("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class _Completion:
    """Engine-side bookkeeping for one completion (one EngineRequest)."""

    parent_id: str
    index: int
    detokenizer: IncrementalDetokenizer | None
    num_emitted: int = 0
    lora_id: int | None = None  # pinned in the LoRA manager until the completion ends
    needs_sync: bool = False  # its next step needs its last token (logprobs, penalties, logits processors, grammar)


class LLMEngine:
    def __init__(self, config: EngineConfig, tokenizer=None, loaded: LoadedWeights | None = None,
                 on_progress: Callable[[str], None] | None = None):
        """`tokenizer` and `loaded` (weights) default to loading from config.model; `on_progress`
        hears about the long steps of a load (weights, KV cache) as they finish."""
        progress = on_progress or (lambda message: None)
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        device = resolve_device(config)
        started = time.perf_counter()
        loaded = loaded or load_weights(config.model)
        arch = loaded.config
        choice = choose_dtype(config.dtype, device,
                              keeps_quantized=loaded.is_quantized and config.keeps_quantized_weights()
                              and device == "cpu")
        self.dtype_choice, dtype = choice, choice.dtype
        logger.info("dtype %s (%s)", dtype, choice.reason)
        progress(f"weights loaded in {time.perf_counter() - started:.1f} s ({arch.num_hidden_layers} layers)")
        self.max_model_len = min(config.max_model_len or arch.max_position_embeddings, arch.max_position_embeddings)
        self.runner = ModelRunner(ModelRunnerConfig(device, dtype, config.block_size, self.max_model_len,
                                                    cuda_graphs=not config.enforce_eager,
                                                    max_num_seqs=config.max_num_seqs,
                                                    max_num_batched_tokens=config.token_budget(device),
                                                    quantized_weights=config.keeps_quantized_weights()), loaded)
        self.runner.sampler.generator.manual_seed(config.seed)
        num_blocks = self.runner.allocate_kv_cache(self._kv_budget(device))
        progress(f"KV cache allocated: {num_blocks} blocks of {config.block_size} tokens on {device}")
        self.kv_cache_manager = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching,
                                              self.runner.kv_groups)
        self.lora = None
        if config.max_loras:
            from .lora import EngineLoRA

            self.lora = self.runner.lora = EngineLoRA(config, self.runner)
        self.scheduler = Scheduler(self.kv_cache_manager, config.max_num_seqs, config.token_budget(device),
                                   self.max_model_len, self.lora and self.lora.admission)
        if tokenizer is None and not config.skip_tokenizer_init:
            tokenizer = load_tokenizer(config.model)
        self.tokenizer = tokenizer
        self.eos_token_id = arch.eos_token_id
        self.vocab_size = arch.vocab_size
        self.structured_outputs = StructuredOutputs(tokenizer, arch.vocab_size, [arch.eos_token_id])
        self.thread_governor = (ThreadGovernor(torch.get_num_threads())
                                if device == "cpu" and config.adaptive_threads else None)
        self._completions: dict[str, _Completion] = {}  # engine request id -> completion
        # Async scheduling: the next step is scheduled and launched before the previous one's tokens are read
        # back (CUDA by default). Completions needing every token before the next step (logprobs, penalties,
        # logits processors, a grammar) make the engine step synchronously while they run. Only models with one
        # KV-cache group: the runner runs models with several (sliding windows) over per-group inputs built each
        # step.
        self.async_scheduling = (device.startswith("cuda") if config.async_scheduling is None
                                 else config.async_scheduling) and len(self.runner.kv_groups) == 1
        self._in_flight = None  # (SchedulerOutput, StepOutput) of the launched step not yet read back
        self._num_sync_completions = 0
        self._children: dict[str, list[str]] = {}  # user request id -> engine request ids
        logger.info("engine ready in %.1fs: %s %s, %d KV blocks of %d tokens, max_model_len %d",
                    time.perf_counter() - started, device, dtype, num_blocks, config.block_size, self.max_model_len)

    def _kv_budget(self, device: str) -> int:
        if self.config.kv_cache_memory_bytes is not None:
            return self.config.kv_cache_memory_bytes
        if device.startswith("cuda"):
            free, _ = torch.cuda.mem_get_info()
            return int(free * self.config.gpu_memory_utilization)
        return EngineConfig.DEFAULT_CPU_KV_BYTES

    # ------------------------------------------------------------------ requests

    def add_request(self, request_id: str, prompt: str | list[int] | None = None,
                    sampling_params: SamplingParams | dict | None = None, *, priority: int = 0,
                    cache_salt=None, detokenize: bool = True, lora: str | None = None) -> None:
        """Queue a request (a text prompt or token ids), optionally with LoRA adapter `lora`. Bad input
        raises InvalidRequestError naming the field; an adapter that is not loaded, NotFound."""
        if isinstance(sampling_params, dict):
            sampling_params = SamplingParams.from_dict(sampling_params)
        params = sampling_params or SamplingParams()
        prompt_ids = self._prompt_ids(prompt)
        if request_id in self._children:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        if len(prompt_ids) >= self.max_model_len:
            raise InvalidRequestError("prompt", f"{len(prompt_ids)} tokens; max_model_len is {self.max_model_len}")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise InvalidRequestError("max_tokens", f"{params.max_tokens} new tokens after a {len(prompt_ids)}-token "
                                      f"prompt exceed max_model_len {self.max_model_len}")
        if detokenize and self.tokenizer is None:
            detokenize = False
        grammar = None
        if params.constraint is not None:  # compiled before any state changes: a bad schema adds nothing
            grammar = self.structured_outputs.compile(params.constraint, constraint_field(params))
        self._check_token_ids(params)
        bad_words = bad_word_ids(self.tokenizer, params.bad_words) if params.bad_words else []
        if params.prompt_logprobs is not None:  # every prompt position must be computed: no prefix-cache hits
            cache_salt = (cache_salt, "prompt_logprobs", request_id, time.monotonic_ns())
        if lora and self.lora is None:
            raise InvalidRequestError("lora", "this engine serves no LoRA adapters (max_loras is 0)")
        lora_ids = self._acquire_lora(lora, params.n) if lora else [None] * params.n
        if lora:  # an adapter's KV never serves another adapter's (or the base model's) prefix
            cache_salt = (cache_salt, "lora", lora_ids[0])
        ids = [request_id] if params.n == 1 else [f"{request_id}#{i}" for i in range(params.n)]
        self._children[request_id] = ids
        arrival = time.monotonic()
        for index, rid in enumerate(ids):
            child = params
            if params.n > 1:  # each completion samples on its own; a seed still makes the set reproducible
                child = SamplingParams(**{**params.__dict__, "n": 1,
                                          "seed": None if params.seed is None else params.seed + index})
            detok = (IncrementalDetokenizer(self.tokenizer, prompt_ids, child.skip_special_tokens, child.stop,
                                            child.include_stop_str_in_output, child.min_tokens)
                     if detokenize else None)
            request = EngineRequest(rid, prompt_ids, child, self.eos_token_id, priority, cache_salt, arrival,
                                    lora_ids[index])
            request.bad_words = bad_words
            if grammar is not None:
                request.grammar = StructuredOutputs.matcher(grammar)
            # min_tokens and bad_words read the output so far: no token may still be on the device
            needs_sync = (child.logprobs is not None or child.has_penalties or child.has_logits_processors
                          or grammar is not None)
            self._completions[rid] = _Completion(request_id, index, detok, lora_id=lora_ids[index],
                                                 needs_sync=needs_sync)
            self._num_sync_completions += needs_sync
            self.scheduler.add_request(request)

    def _check_token_ids(self, params: SamplingParams) -> None:
        for name in ("stop_token_ids", "allowed_token_ids", "logit_bias"):
            ids = getattr(params, name) or ()
            if any(t >= self.vocab_size for t in ids):
                raise InvalidRequestError(name, f"token ids must be in [0, {self.vocab_size})")

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError("prompt", "text prompts need a tokenizer; pass token ids")
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            if any(not 0 <= t < self.vocab_size for t in ids):
                raise InvalidRequestError("prompt", f"token ids must be in [0, {self.vocab_size})")
        else:
            raise InvalidRequestError("prompt", "must be a string or a list of token ids")
        if not ids:
            raise InvalidRequestError("prompt", "is empty")
        return ids

    def abort(self, request_id: str) -> None:
        """Stop a request now; its blocks return to the pool at once. Unknown ids are ignored."""
        for rid in self._children.pop(request_id, ()):
            self.scheduler.finish_request(rid, RequestStatus.FINISHED_ABORTED)
            self._end_completion(self._completions.pop(rid, None))

    def is_active(self, request_id: str) -> bool:
        """True while any completion of the user request is unfinished."""
        return request_id in self._children

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self._in_flight is not None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block, as vLLM's LLM.reset_prefix_cache; only while no block is in use
        (False, nothing forgotten, otherwise). A run that starts after it gets the first run's contiguous block
        tables: a cache left full of blocks no request will hit again keeps later tables scattered (block_pool.py's
        cold rule; benchmarks/results/llm_blocks-2026-11-27.md)."""
        return self.kv_cache_manager.block_pool.reset_prefix_cache()

    # ------------------------------------------------------------------ the loop

    def step(self) -> list[RequestOutput]:
        """Schedule and launch a step; returns the outputs of the step read back now: this one, or under
        async scheduling the previous one (read while this one runs on the device)."""
        outputs = []
        if self._in_flight is not None and not (self.async_scheduling and self._num_sync_completions == 0):
            outputs = self._read_back(*self._in_flight)  # a completion that needs every token came in
            self._in_flight = None
        out = self.scheduler.schedule()
        if out.is_empty:
            if self._in_flight is not None:
                outputs, self._in_flight = self._read_back(*self._in_flight), None
            return outputs
        if self.thread_governor is not None:
            self.thread_governor.update()
        launched = self.runner.execute(out)
        self.scheduler.commit(out)
        if not self.async_scheduling or self._num_sync_completions:
            return outputs + self._read_back(out, launched)
        previous, self._in_flight = self._in_flight, (out, launched)
        return outputs + (self._read_back(*previous) if previous is not None else [])

    def _read_back(self, out, launched) -> list[RequestOutput]:
        sampled = launched.result()
        for request, logprobs in zip(out.requests, sampled.logprobs):
            if logprobs is not None:
                request.logprobs.append(logprobs)
        updated = self.scheduler.update_from_output(out, sampled.token_ids)
        return [self._make_output(request) for request in updated]

    def _make_output(self, request: EngineRequest) -> RequestOutput:
        completion = self._completions[request.request_id]
        tokens, num_prompt = request.all_token_ids, request.num_prompt_tokens
        new_ids = tokens[num_prompt + completion.num_emitted:]
        if new_ids and request.first_token_time is None:
            request.first_token_time = time.monotonic()
        prompt_logprobs = None
        if request.prompt_logprobs is not None and new_ids and not completion.num_emitted:
            # vLLM's shape: the first prompt token has no log-probability
            prompt_logprobs = [{tokens[0]: None}, *request.prompt_logprobs]
        completion.num_emitted = num_output = len(tokens) - num_prompt
        delta, text = "", ""
        finished = request.is_finished
        detok = completion.detokenizer
        if detok is not None:
            delta = detok.add_tokens(new_ids)
            text = detok.text
            if detok.stopped_by is not None and not finished:
                self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_STOPPED)
                request.stop_reason = detok.stopped_by
                finished = True
            if finished:
                delta += detok.flush()
        if finished:
            self._finish(request.request_id, completion.parent_id)
        return RequestOutput(
            request_id=completion.parent_id, index=completion.index, new_token_ids=new_ids, text_delta=delta,
            token_ids=tokens[num_prompt:], text=text, finished=finished,
            finish_reason=request.finish_reason if finished else None, stop_reason=request.stop_reason,
            num_prompt_tokens=num_prompt, num_generated_tokens=num_output,
            num_cached_tokens=request.num_cached_tokens,
            new_logprobs=request.logprobs[-len(new_ids):] if request.logprobs else [],
            prompt_logprobs=prompt_logprobs,
            arrival_time=request.arrival_time, first_scheduled_time=request.first_scheduled_time,
            first_token_time=request.first_token_time)

    def _finish(self, rid: str, parent_id: str):
        self._end_completion(self._completions.pop(rid, None))
        siblings = self._children.get(parent_id)
        if siblings is not None and all(s not in self._completions for s in siblings):
            del self._children[parent_id]

    def _acquire_lora(self, name: str, n: int) -> list[int]:
        try:
            return [self.lora.manager.acquire(name) for _ in range(n)]
        except NotFound as exc:  # n pins of one adapter: the first one fails or none does
            raise AdapterNotFoundError(exc.message) from None

    def _end_completion(self, completion: _Completion | None):
        if completion is None:
            return
        self._num_sync_completions -= completion.needs_sync
        if completion.lora_id is not None:
            self.lora.manager.release(completion.lora_id)

    def generate(self, prompts: list, sampling_params: SamplingParams | None = None,
                 loras: list[str | None] | None = None) -> list[list[RequestOutput]]:
        """Offline helper: run prompts (each with its LoRA adapter from `loras`, if given) to completion;
        returns the final output of each completion per prompt."""
        ids = [f"generate-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
        for rid, prompt, lora in zip(ids, prompts, loras or [None] * len(prompts)):
            self.add_request(rid, prompt, sampling_params, lora=lora)
        final: dict[str, dict[int, RequestOutput]] = {rid: {} for rid in ids}
        while self.has_unfinished_requests():
            for output in self.step():
                if output.finished and output.request_id in final:
                    final[output.request_id][output.index] = output
        return [[final[rid][i] for i in sorted(final[rid])] for rid in ids]

    def stats(self) -> dict:
        """Occupancy and counters (EngineStats' fields; readable from another thread while the engine steps)."""
        kv, scheduler = self.kv_cache_manager, self.scheduler
        return {"num_running": len(scheduler.running), "num_waiting": len(scheduler.waiting),
                "num_blocks": self.runner.num_blocks, "num_free_blocks": kv.num_free_blocks,
                "num_prefix_queries": kv.num_prefix_queries, "num_prefix_hits": kv.num_prefix_hits,
                "prefix_cache_hit_rate": kv.prefix_cache_hit_rate, "num_preemptions": scheduler.num_preemptions,
                "lora": self.lora.stats(scheduler) if self.lora is not None else None}
