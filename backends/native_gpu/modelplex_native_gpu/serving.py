"""The modelplex ModelInstance over the engine (engine/launch.py): `GenerateInputs` in, `TextChunk`s out (the
host adapts the KServe tensor form onto them).

Config `parameters` are EngineConfig fields plus `max_queue_size` (requests waiting for a batch
slot, default 256): beyond it a request is refused at once with Unavailable (503 / 429). The engine runs in
a process of its own unless `engine_process` is false; if it dies, the version turns UNAVAILABLE until reloaded.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator

from modelplex import (
    LORA_MODULES_PARAMETER,
    EngineStats,
    GenerateInputs,
    InstanceContext,
    InternalError,
    InvalidInput,
    LLMMetrics,
    ModelContext,
    ModelInstance,
    NotFound,
    TextChunk,
    Unavailable,
    Unsupported,
    llm_protocol,
    params,
    tool_parser,
)

from . import vllm_folder
from .chat_template import render_chat
from .config import EngineConfig
from .engine.outputs import RequestOutput
from .engine.structured_output import constraint_field
from .errors import AdapterNotFoundError, EngineDeadError, EngineError
from .protocol import GenerateCall, parse_inputs, text_chunk

log = logging.getLogger(__name__)

_INT_FIELDS = ("block_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes", "max_model_len",
               "num_threads", "seed", "max_loras", "max_lora_rank", "max_cpu_loras")
_request_ids = itertools.count()
QUEUE_SIZE_PARAMETER = "max_queue_size"
CHAT_TEMPLATE_PARAMETER = "chat_template"  # a Jinja template, or a file (relative to the model folder)
TOOL_PARSER_PARAMETER = "tool_call_parser"  # read by the OpenAI chat route (modelplex.llm.tool_parsers)
HOST_PARAMETERS = (QUEUE_SIZE_PARAMETER, LORA_MODULES_PARAMETER, CHAT_TEMPLATE_PARAMETER, TOOL_PARSER_PARAMETER)
DEFAULT_MAX_QUEUE_SIZE = 256
RETRY_AFTER_SECONDS = 1.0
SLOT_HEADROOM = 16


def engine_config(ctx: ModelContext, device: str | None) -> EngineConfig:
    """EngineConfig from the weights location and config.pbtxt `parameters` (after a vLLM folder's
    model.json); unknown keys are errors."""
    model = ctx.version_path / "model.gguf"
    if not model.is_file():
        model = ctx.version_path
    settings = {}
    if vllm_folder.is_vllm_folder(ctx.config):
        model, settings = vllm_folder.engine_settings(ctx)
    fields = {f.name for f in dataclasses.fields(EngineConfig)} - {"model"}
    for key, value in ctx.parameters.items():
        if key in HOST_PARAMETERS:  # read by the instance, the host or the OpenAI routes
            continue
        if key not in fields:
            known = sorted(fields | set(HOST_PARAMETERS))
            raise InvalidInput(f"model '{ctx.name}': unknown parameter '{key}' (known: {known})")
        try:
            if key in _INT_FIELDS:
                settings[key] = int(value)
            elif key == "gpu_memory_utilization":
                settings[key] = float(value)
            elif key in ("enable_prefix_caching", "adaptive_threads", "enforce_eager", "quantized_weights",
                         "engine_process"):
                settings[key] = params.parse_bool(value, f"parameter '{key}'")
            else:
                settings[key] = value
        except ValueError:
            raise InvalidInput(f"model '{ctx.name}': parameter '{key}' is not a number: {value!r}") from None
    settings.setdefault("device", device)
    try:
        return EngineConfig(model=str(model), **settings)
    except EngineError as exc:
        raise InvalidInput(f"model '{ctx.name}': {exc}") from None


def max_queue_size(ctx: ModelContext) -> int:
    value = ctx.parameters.get(QUEUE_SIZE_PARAMETER, str(DEFAULT_MAX_QUEUE_SIZE))
    try:
        size = int(value)
    except ValueError:
        size = -1
    if size < 0:
        raise InvalidInput(f"model '{ctx.name}': parameter '{QUEUE_SIZE_PARAMETER}' must be an integer >= 0, "
                           f"got {value!r}")
    return size


def auto_complete_config(ctx: ModelContext) -> None:
    """Declare the LLM protocol's tensors (`modelplex.llm.tensor_protocol`) when config.pbtxt lists none;
    a Triton vLLM-backend folder gets that backend's tensors and decoupled (`vllm_folder`)."""
    if vllm_folder.is_vllm_folder(ctx.config):
        vllm_folder.auto_complete(ctx)
    else:
        llm_protocol.declare_generate_tensors(ctx.config)


def chat_template(ctx: ModelContext) -> str | None:
    """The `chat_template` parameter: a file's text (relative to the model folder, or absolute), or the template."""
    value = ctx.parameters.get(CHAT_TEMPLATE_PARAMETER)
    if not value:
        return None
    if "{" not in value:  # a path: templates always hold Jinja blocks
        path = ctx.model_path / value
        try:
            return path.read_text()
        except OSError as exc:
            raise InvalidInput(f"model '{ctx.name}': parameter '{CHAT_TEMPLATE_PARAMETER}' names {path}, which "
                               f"cannot be read: {exc.strerror}") from None
    return value


def check_tool_parser(ctx: ModelContext) -> None:
    name = ctx.parameters.get(TOOL_PARSER_PARAMETER)
    if name:
        try:
            tool_parser(name)
        except ValueError as exc:
            raise InvalidInput(f"model '{ctx.name}': parameter '{TOOL_PARSER_PARAMETER}': {exc}") from None


def engine_phases(output: RequestOutput) -> list[tuple[str, int, int, dict]] | None:
    """The engine's queue and prefill of a request, as the host traces them (`InferResponse.phases`)."""
    if output.first_scheduled_time is None or output.first_token_time is None:
        return None
    arrival, scheduled, first_token = (int(t * 1e9) for t in (output.arrival_time, output.first_scheduled_time,
                                                              output.first_token_time))
    return [("engine queue", arrival, scheduled, {}),
            ("prefill", scheduled, first_token, {"llm.num_prompt_tokens": output.num_prompt_tokens,
                                                 "llm.num_cached_tokens": output.num_cached_tokens})]


def engine_times(output: RequestOutput) -> tuple[float, float] | None:
    """(queue, prefill) seconds of a request once its first token came (the metrics' phases)."""
    if output.first_scheduled_time is None or output.first_token_time is None:
        return None
    return (output.first_scheduled_time - output.arrival_time, output.first_token_time - output.first_scheduled_time)


class LLMInstance(ModelInstance):
    """One engine per instance; the host may hand it many requests at once (they batch inside).

    Invariant: at most `max_queue_size` sequences wait in the engine's scheduler; leaving a stream
    early (client gone, cancelled) closes the engine's stream, which aborts the request.
    """

    def __init__(self, ictx: InstanceContext):
        from .engine.launch import start_engine

        device = "cuda:%d" % ictx.device_id if ictx.kind == "GPU" else ("cpu" if ictx.kind == "CPU" else None)
        self.max_queue_size = max_queue_size(ictx.model)
        check_tool_parser(ictx.model)
        template = chat_template(ictx.model)
        config = engine_config(ictx.model, device)
        try:
            self.engine = start_engine(config, ictx.report_progress, ictx.report_failure, ictx.cancel)
        except EngineError as exc:
            raise InvalidInput(f"model '{ictx.model.name}': {exc}") from None
        if template is not None and self.engine.tokenizer is not None:
            self.engine.tokenizer.chat_template = template
        self.max_num_seqs = config.max_num_seqs
        self.model = (ictx.model.name, str(ictx.model.version))
        self.llm_metrics = LLMMetrics()
        # More host slots than the engine runs plus queues: the bound that refuses is ours, never
        # an unbounded wait for a host slot (the headroom covers refusals and streams closing).
        self.max_concurrency = config.max_num_seqs + self.max_queue_size + SLOT_HEADROOM
        self.block_size = config.block_size

    async def generate(self, inputs: GenerateInputs) -> AsyncIterator[TextChunk]:
        """The request's chunks: one per engine output that adds text, log-probabilities or a finish
        (token ids of outputs that add none go with the next chunk); the engine's phases on the first."""
        call = await asyncio.to_thread(self._parse, inputs)  # tokenizing and templates: never on the loop
        held: dict[int, tuple[list[int], list[dict]]] = {}  # per completion: token ids not yet sent
        phases_sent = False
        async with contextlib.aclosing(self._generate(inputs, call)) as outputs:
            async for output in outputs:
                token_ids, logprobs = held.setdefault(output.index, ([], []))
                token_ids += output.new_token_ids
                logprobs += output.new_logprobs
                if not (output.text_delta or output.finished or output.new_logprobs):
                    continue
                del held[output.index]
                chunk = text_chunk(output, call.params, self.engine.tokenizer, token_ids, logprobs)
                if not phases_sent:  # with the first chunk: the prefill is over by then
                    chunk.phases, phases_sent = engine_phases(output), True
                yield chunk

    def _parse(self, inputs: GenerateInputs) -> GenerateCall:
        return parse_inputs(inputs, self.engine.tokenizer, self.engine.max_model_len, self.engine.vocab_size)

    def _check_queue(self, n: int) -> None:
        """A request's n completions count as n sequences: refused (Unavailable) when those that cannot
        start at once would take the queue past max_queue_size. The event loop alone adds requests,
        so no other add interleaves between this check and the add."""
        stats = self.engine_stats()
        free = max(0, self.max_num_seqs - stats.num_running - stats.num_waiting)
        if stats.num_waiting >= self.max_queue_size or stats.num_waiting + max(0, n - free) > self.max_queue_size:
            raise Unavailable(f"model '{self.model[0]}': {self.max_queue_size} requests already wait; try again "
                              f"later", retry_after=RETRY_AFTER_SECONDS)

    async def _generate(self, inputs: GenerateInputs, call: GenerateCall):
        lora = inputs.lora or None  # the host has checked it is loaded
        if lora is not None:
            self._check_lora()
            await self.engine.lora_prefetch(lora)  # a disk read, never on the engine loop
        self._check_queue(call.params.n)
        request_id = f"{inputs.request_id or 'req'}-{next(_request_ids)}"
        timer = self.llm_metrics.timer(lora or "")
        try:
            if call.params.constraint is not None:  # compiled off the event loop and the engine's steps
                await self.engine.compile_constraint(call.params.constraint, constraint_field(call.params))
            stream = self.engine.generate(request_id, call.prompt_ids, call.params, lora=lora, priority=call.priority)
            async with contextlib.aclosing(stream):
                async for output in stream:
                    timer.on_tokens(output.index, len(output.new_token_ids), output.finished, output.finish_reason,
                                    output.num_prompt_tokens, engine_times(output))
                    yield output
        except AdapterNotFoundError as exc:  # unloaded after the host checked it
            raise NotFound(str(exc)) from None
        except EngineError as exc:  # raised on the first step of the stream, before any output
            raise InvalidInput(str(exc), param=exc.field) from None
        except EngineDeadError as exc:  # its process died (the version is UNAVAILABLE now) or it was shut down
            raise InternalError(f"model '{self.model[0]}': {exc}") from None

    # ---- LoRA adapters (modelplex_multilora; the host has checked names and paths) -------------
    def _check_lora(self) -> None:
        if not self.engine.has_lora:
            raise Unsupported(f"model '{self.model[0]}' was loaded without LoRA support: set its parameter max_loras")

    async def load_adapter(self, name: str, path) -> None:
        self._check_lora()
        await self.engine.lora_register(name, path)

    async def unload_adapter(self, name: str) -> None:
        self._check_lora()
        await self.engine.lora_unload(name)  # requests in flight (running or waiting) finish with it

    async def tokenize(self, inputs: GenerateInputs, add_special_tokens: bool = False) -> list[int]:
        """The prompt's token ids as a request would run them (chat template applied), off the event loop."""
        tokenizer = self.engine.tokenizer

        def run():
            if inputs.chat is not None:
                return tokenizer.encode(render_chat(tokenizer, inputs.chat), add_special_tokens=add_special_tokens)
            return tokenizer.encode(inputs.text, add_special_tokens=add_special_tokens)

        return await asyncio.to_thread(run)

    async def detokenize(self, token_ids: list[int]) -> str:
        if any(not 0 <= t < self.engine.vocab_size for t in token_ids):
            raise InvalidInput(f"tokens: token ids must be in [0, {self.engine.vocab_size})", param="tokens")
        return await asyncio.to_thread(self.engine.tokenizer.decode, token_ids)

    def list_adapters(self) -> list[dict]:
        return self.engine.lora_rows()

    def engine_stats(self) -> EngineStats:
        """Scheduler and KV-cache occupancy (the engine_stats route, the LLM metrics, tests); in process mode,
        as of the engine's last step, with its pid in `extra`."""
        stats = self.engine.stats()
        extra = {"prefix_cache_hit_rate": stats["prefix_cache_hit_rate"]}
        if self.engine.pid is not None:
            extra["engine_pid"] = self.engine.pid
        return EngineStats(
            num_running=stats["num_running"], num_waiting=stats["num_waiting"], max_queue_size=self.max_queue_size,
            num_blocks=stats["num_blocks"], num_free_blocks=stats["num_free_blocks"],
            num_prefix_queries=stats["num_prefix_queries"], num_prefix_hits=stats["num_prefix_hits"],
            num_preemptions=stats["num_preemptions"], lora=stats["lora"], max_model_len=self.engine.max_model_len,
            block_size=self.block_size, extra=extra)

    async def close(self) -> None:
        await self.engine.close()
