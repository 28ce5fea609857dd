"""The contract between the host and a backend plugin: what a backend declares and what it builds.

A plugin returns `BackendSpec` records from the `modelplex_backends` hook. The host owns the
repository, model states, queues, batching and metrics; a backend only turns a loaded
`config.pbtxt` plus a version folder into `ModelInstance`s that execute requests.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator, Callable

from .errors import ModelplexError, Unsupported
from .tensors import InferRequest, InferResponse

if TYPE_CHECKING:
    from .dataplane import DataPlane
    from .stats import ModelStats


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


class ModelInstance(ABC):
    """One execution instance of a model version. The host never calls one instance concurrently.

    `execute` receives one or more requests (more when the host batches) and returns one entry per
    request, in order: its `InferResponse`, or the `ModelplexError` that request alone failed with
    (its batch mates still get their answers). Raising fails every request of the call.
    Decoupled models implement `stream` instead.
    """

    # How many requests the host may give this instance at once; None: the BackendSpec's
    # max_concurrency_per_instance. (A decoupled Python model streams many requests while its
    # worker runs one execute at a time, as in Triton; the same backend's other models take one.)
    max_concurrency: int | None = None

    @abstractmethod
    async def execute(self, requests: list[InferRequest]) -> list[InferResponse | ModelplexError]:
        ...

    def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        raise Unsupported("this model does not stream responses")

    def engine_stats(self) -> dict | None:
        """Occupancy of an instance that schedules requests itself (an LLM engine): e.g. running
        and waiting requests, free KV-cache blocks. None (the default): not such an engine.
        Called from any thread (HTTP routes, metric scrapes); must not block on a running step."""
        return None

    async def close(self) -> None:
        """Release sessions, threads, device memory. Called once, after the last request."""

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
    # Its instances may call other models through the data plane (ensembles, BLS). A backend that
    # never does gets a cheaper span per traced request: recorded after the fact, not made current.
    calls_models: bool = True
