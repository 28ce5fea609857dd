"""The contract between the host and a backend plugin: what a backend declares and what it builds.

A plugin returns `BackendSpec` records from the `modelplex_backends` hook. The host owns the
repository, model states, queues, batching and metrics; a backend only turns a loaded
`config.pbtxt` plus a version folder into `ModelInstance`s that execute requests.
"""
from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ModelplexError, Unsupported
from .tensors import InferRequest, InferResponse

if TYPE_CHECKING:
    from ..dataplane import DataPlane
    from ..llm.contract import TextChunk
    from ..llm.tensor_protocol import GenerateInputs
    from ..observability.llm_metrics import LLMMetrics
    from ..observability.stats import ModelStats


@dataclass
class ModelContext:
    """What a backend knows about the model version it serves.

    `config` is Triton's `ModelConfig` protobuf message (mutable during auto-complete only);
    `parameters` flattens `config.parameters` to plain strings. `dataplane` lets a backend that
    composes models (ensembles) call other models through the one request path; `stats` is the
    version's statistics. Both are set by the host.
    """

    name: str
    version: int
    model_path: Path
    version_path: Path
    config: object
    parameters: dict[str, str] = field(default_factory=dict)
    dataplane: DataPlane | None = None
    stats: ModelStats | None = None

    @property
    def model_file(self) -> Path:
        """The file (or folder) named by `default_model_filename` inside the version folder."""
        return self.version_path / self.config.default_model_filename


class LoadCancel:
    """Set by the host when it gives up on an instance's load (`--model-load-timeout-secs`): the
    callbacks registered with `on_cancel` run then (at once if it is already set), on the host's
    thread, so a backend can stop what the load started (a worker process) instead of leaving it
    running in a thread nobody waits for. Safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.is_set = False

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run `callback` when the load is cancelled; returns a function that forgets it (call it
        once the load no longer needs stopping, e.g. when it succeeded)."""
        with self._lock:
            if not self.is_set:
                self._callbacks.append(callback)
                return lambda: self._forget(callback)
        callback()
        return lambda: None

    def _forget(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def set(self) -> None:
        with self._lock:
            self.is_set, callbacks, self._callbacks = True, self._callbacks, []
        for callback in callbacks:
            callback()


@dataclass
class InstanceContext:
    """One instance of an `instance_group`: which device it runs on and its index."""

    model: ModelContext
    name: str
    index: int
    kind: str  # "CPU", "GPU", "AUTO" or "MODEL" (Triton's KIND_* without the prefix)
    device_id: int = 0
    # For an instance that can no longer serve (its worker process died): the host marks the model
    # version UNAVAILABLE with `reason` until it is reloaded. Safe to call from any thread.
    report_failure: Callable[[str], None] = field(default=lambda reason: None, repr=False)
    # For a long load: what is done so far ("weights loaded in 2.1 s"). The host logs it and shows it
    # as the LOADING version's reason in the repository index. Safe to call from any thread.
    report_progress: Callable[[str], None] = field(default=lambda message: None, repr=False)
    # Set when the host gives up on this load (it timed out): `cancel.on_cancel(stop)` to end what the
    # load started (a process, a download) rather than leave it running unobserved.
    cancel: LoadCancel = field(default_factory=LoadCancel, repr=False)


@dataclass
class EngineStats:
    """Occupancy of an instance that schedules requests itself (an LLM engine), as its
    `engine_stats()` reports it. The engine_stats route, the `vllm:*` gauges, the status page and
    `modelplex models stats` read these fields; a backend that has none of a kind leaves its default.
    """

    num_running: int = 0  # requests in the running batch
    num_waiting: int = 0  # requests admitted, waiting for a place in the batch
    max_queue_size: int | None = None  # beyond it, requests are refused at once
    num_blocks: int | None = None  # KV-cache blocks, the reserved null block included; None: not paged here
    num_free_blocks: int | None = None
    kv_cache_usage: float | None = None  # 0.0-1.0, for engines that do not count blocks
    num_prefix_queries: int = 0  # prompt tokens looked up in the prefix cache since load
    num_prefix_hits: int = 0
    num_preemptions: int = 0
    # Adapter occupancy for the LoRA metrics: `max_loras`, and `running` / `waiting` adapter names.
    lora: dict | None = None
    max_model_len: int | None = None  # the context length (/v1/models, /tokenize)
    block_size: int | None = None  # tokens per KV block (vllm:cache_config_info)
    # What else this engine reports (shown by the engine_stats route as is).
    extra: dict = field(default_factory=dict)

    @property
    def kv_usage(self) -> float:
        """The share of the KV cache in use, from the engine's own figure or its blocks."""
        if self.kv_cache_usage is not None:
            return self.kv_cache_usage
        if not self.num_blocks:
            return 0.0
        usable = self.num_blocks - 1  # block 0 is the pool's reserved null block
        return (usable - (self.num_free_blocks or 0)) / usable if usable else 0.0

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "extra" and v is not None}
        return {**out, **self.extra}


class ModelInstance:
    """One execution instance of a model version. The host never calls one instance concurrently.

    `execute` receives one or more requests (more when the host batches) and returns one entry per
    request, in order: its `InferResponse`, or the `ModelplexError` that request alone failed with
    (its batch mates still get their answers). Raising fails every request of the call.
    Decoupled models implement `stream` instead; text-generation models implement `generate` alone
    (the host adapts the KServe tensor form of `modelplex.llm.tensor_protocol` onto it).
    """

    # How many requests the host may give this instance at once; None: the BackendSpec's
    # max_concurrency_per_instance. (A decoupled Python model streams many requests while its
    # worker runs one execute at a time, as in Triton; the same backend's other models take one.)
    max_concurrency: int | None = None
    # An LLM instance's `vllm:*` series (`modelplex.LLMMetrics`): its request path adds to it, the
    # host renders it at scrape time and adds its latency sums to `engine_stats`.
    llm_metrics: LLMMetrics | None = None

    async def execute(self, requests: list[InferRequest]) -> list[InferResponse | ModelplexError]:
        raise Unsupported("this model takes no tensor requests")

    def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        raise Unsupported("this model does not stream responses")

    def generate(self, inputs: GenerateInputs) -> AsyncIterator[TextChunk]:
        """A text-generation model's `TextChunk`s for `inputs` (an async generator): deltas of each
        completion until its chunk with a finish reason. The host has checked the adapter and the
        limits (`modelplex.llm.limits`); the backend tokenizes off the event loop, raises InvalidInput
        naming the field, and aborts the request when the iterator is closed early."""
        raise Unsupported("this model does not generate text")

    @property
    def generates_text(self) -> bool:
        return type(self).generate is not ModelInstance.generate

    def engine_stats(self) -> EngineStats | None:
        """Occupancy of an instance that schedules requests itself (an LLM engine): running and
        waiting requests, KV-cache blocks. None (the default): not such an engine.
        Called from any thread (HTTP routes, metric scrapes); must not block on a running step."""
        return None

    async def close(self) -> None:
        """Release sessions, threads, device memory. Called once, after the last request."""

    # ---- tokenizer (optional; LLM backends: the /tokenize and /detokenize routes) ----------------
    async def tokenize(self, inputs, add_special_tokens: bool = False) -> list[int]:
        """The token ids of `inputs` (a `modelplex.llm.tensor_protocol.GenerateInputs`: text or chat),
        as a request would run them. Raise InvalidInput naming the field for bad input."""
        raise Unsupported("its backend does not expose a tokenizer")

    async def detokenize(self, token_ids: list[int]) -> str:
        raise Unsupported("its backend does not expose a tokenizer")

    # ---- LoRA adapters (optional; see modelplex/adapters.py for the host's side) ---------------
    # The host validates names and confines paths before calling these; a request picks an adapter
    # with the request parameter `lora` (the host has already checked it is loaded).
    async def load_adapter(self, name: str, path: Path) -> None:
        """Make adapter `name` (the folder `path`) usable. Raise InvalidInput with the reason for a
        bad adapter, leaving nothing loaded; off the event loop for slow work."""
        raise Unsupported("its backend does not serve LoRA adapters")

    async def unload_adapter(self, name: str) -> None:
        """Refuse new requests for `name`, wait until its running requests finish, then free it."""
        raise Unsupported("its backend does not serve LoRA adapters")

    def list_adapters(self) -> list[dict]:
        """One dict per loaded adapter: at least `name`, `source` (the path) and `state`."""
        return []


def answer_each(requests: list[InferRequest],
                run_one: Callable[[InferRequest], InferResponse]) -> list[InferResponse | ModelplexError]:
    """`execute`'s contract for a backend that runs requests one at a time: each request's response, or
    the `ModelplexError` it alone failed with (its batch mates still get their answers)."""
    results: list[InferResponse | ModelplexError] = []
    for request in requests:
        try:
            results.append(run_one(request))
        except ModelplexError as e:
            results.append(e)
    return results


@dataclass(frozen=True)
class ModelDependency:
    """A model that a model calls (an ensemble's step): it loads first, and it cannot be unloaded
    while its user is loaded (unless the unload asks for `unload_dependents`). `role` names the
    dependency in errors, e.g. "step 2"."""

    model: str
    role: str


@dataclass(frozen=True)
class BackendSpec:
    """A backend a plugin provides.

    Example::

        @modelplex.hookimpl
        def modelplex_backends():
            return [BackendSpec(name="onnx", aliases=("onnxruntime",),
                                platforms=("onnxruntime_onnx",),
                                default_model_filename="model.onnx",
                                create_instance=OnnxInstance.create,
                                auto_complete_config=complete_from_onnx)]
    """

    name: str
    create_instance: Callable[[InstanceContext], ModelInstance]
    aliases: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()
    default_model_filename: str = ""
    # Fills what `config.pbtxt` left out (inputs, outputs, max_batch_size) from the model file.
    auto_complete_config: Callable[[ModelContext], None] | None = None
    # Concurrency the host may give one instance; LLM engines batch internally and take many.
    max_concurrency_per_instance: int = 1
    # The dynamic batcher concatenates a batch's requests along dim 0 into one request (and splits
    # the response back), so `execute` runs them in one call; for backends whose runtime takes a
    # whole batch at once (ONNX Runtime, OpenVINO).
    merges_batches: bool = False
    # The models a model of this backend depends on, read from its config (an ensemble's steps).
    dependencies: Callable[[Any], list[ModelDependency]] | None = None
    # Its instances may call other models through the data plane (ensembles, BLS). A backend that
    # never does gets a cheaper span per traced request: recorded after the fact, not made current.
    calls_models: bool = True
    # The host runs this backend's first use in the process (its first auto_complete_config and
    # create_instance, until one instance exists) alone, so lazy first imports cannot race. False for a
    # backend whose model code runs in processes of its own (nothing to import here).
    first_use_alone: bool = True
