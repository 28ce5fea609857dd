"""The one request path. HTTP, gRPC and every other front door translate to and from these calls."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING

from . import __version__
from .core.backend import BackendSpec
from .core.errors import InvalidInput, NotFound, Unavailable
from .core.extensions import DeviceReport
from .core.settings import ServerConfig
from .core.shared_memory import SharedMemoryRegistry
from .core.shm_tensors import output_targets, read_inputs, write_outputs
from .core.tensors import InferRequest, InferResponse
from .llm import tensor_adapter
from .llm.contract import TextChunk
from .llm.limits import GenerateLimits
from .llm.tensor_protocol import GenerateInputs
from .models.adapters import LORA_PARAMETER, AdapterSource, resolve_folder
from .models.classification import classify, requested_classes
from .models.manager import ModelManager
from .models.memory import RequestMemory
from .models.repository import check_name
from .observability.logs import bind_request
from .observability.tracing import Tracing

if TYPE_CHECKING:
    from .core.backend import ModelInstance

# Only what is implemented: clients probe these before using an extension. (CUDA shared memory is
# not: without a GPU its routes answer as a Triton built without GPU support does.)
EXTENSIONS = ["classification", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
              "model_configuration", "binary_tensor_data", "parameters", "statistics"]
SHM_EXTENSION = "system_shared_memory"  # advertised when clients may register regions (--allow-client-shm)


class DataPlane:
    """Owns the model manager it serves; backends that call other models (ensembles, BLS) get this
    data plane through `ModelContext.dataplane`, so their calls take the same path as a client's."""

    def __init__(self, settings: ServerConfig, backends: dict[str, BackendSpec],
                 device_reports: Callable[[], list[DeviceReport]] = list):
        self.settings = settings
        self.manager = ModelManager(settings, backends, dataplane=self)
        self._device_reports = device_reports
        self.tracing = Tracing(settings.trace)  # the front doors start a request's trace through it
        self.shared_memory = SharedMemoryRegistry(settings.allow_client_shm)  # this server's regions
        self.accepting = True  # False once shutdown starts: not ready, no new requests
        self.request_memory = RequestMemory(settings.max_request_memory_bytes)  # the doors reserve bodies
        self.generate_limits = GenerateLimits(max_prompt_bytes=settings.max_prompt_bytes)

    # ---- health and metadata ------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Not before the startup load has ended (whatever its outcome; with strict readiness, every
        model READY too), as Triton, whose ports open only then: a pod must not take traffic before
        its models exist. Not once shutdown began."""
        return self.accepting and self.manager.started and (not self.settings.strict_readiness
                                                             or self.manager.is_ready())

    def metadata(self) -> dict:
        extensions = EXTENSIONS + [SHM_EXTENSION] if self.shared_memory.allowed else EXTENSIONS
        return {"name": self.settings.server_id, "version": __version__, "extensions": extensions}

    def has_model(self, name: str) -> bool:
        """Whether the server knows model `name` (in any state)."""
        return name in self.manager.entries

    async def devices(self) -> dict:
        """The devices the backends run on (`modelplex_devices` hook), off the event loop: asking a
        runtime for its devices can take seconds the first time."""
        reports = await asyncio.to_thread(self._device_reports)
        out: dict = {"devices": []}
        for report in reports:
            out[f"{report.backend}_version"] = report.version
            out["devices"] += [{**device, "backend": report.backend} for device in report.devices]
        return out

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            return self.manager.get(name, version).is_ready
        except (NotFound, Unavailable):
            return False

    def model_metadata(self, name: str, version: str = "") -> dict:
        mv = self.manager.get(name, version)
        entry = self.manager.entries[name]
        batch = [-1] if mv.config.max_batch_size > 0 else []

        def tensors(specs):
            return [{"name": s.name, "datatype": s.datatype, "shape": batch + list(s.dims)} for s in specs.values()]

        return {
            "name": name,
            "versions": [str(v) for v, m in sorted(entry.versions.items()) if m.is_ready],
            "platform": mv.config.platform or mv.config.backend,
            "inputs": tensors(mv.validator.inputs),
            "outputs": tensors(mv.validator.outputs),
        }

    def model_config(self, name: str, version: str = ""):
        """Triton's `ModelConfig` protobuf message of a loaded version."""
        return self.manager.get(name, version).config

    # ---- inference ----------------------------------------------------------------------
    def check_model(self, name: str, version: str = "") -> None:
        """Raises as `infer` would for a model it cannot serve: the doors ask before decoding a body,
        so an unknown model is a 404 whatever the body holds."""
        self.manager.get(name, version)

    async def infer(self, request: InferRequest) -> InferResponse:
        if not self.accepting:
            raise Unavailable("server is shutting down")
        bind_request(request)
        mv = self.manager.get(request.model_name, request.model_version)
        if mv.decoupled:
            raise InvalidInput(f"model '{mv.name}' is decoupled: use a streaming API "
                               "(ModelStreamInfer, generate_stream)")
        if LORA_PARAMETER in request.parameters and not mv.generates_text:
            mv.adapters.check(request.parameters[LORA_PARAMETER])
        targets, classes = self._prepare(request)
        if mv.generates_text:
            form, _, chunks = self._tensor_generate(mv, request)
            response = await tensor_adapter.one_response(form, chunks)
        else:
            response = await mv.infer(request)
        if request.outputs:
            wanted = {o.name for o in request.outputs}
            response.outputs = [t for t in response.outputs if t.name in wanted]
            self._finish(response, mv, targets, classes)
        return response

    def _prepare(self, request: InferRequest) -> tuple[dict, dict]:
        """Inputs read from shared memory; where outputs go (shared memory) and which are classified."""
        if any(t.data is None for t in request.inputs):
            read_inputs(request, self.shared_memory, self.settings.tensor_limits)
        if not any(o.parameters for o in request.outputs):
            return {}, {}
        return output_targets(request, self.shared_memory), requested_classes(request)

    @staticmethod
    def _finish(response: InferResponse, mv, targets: dict, classes: dict) -> None:
        if classes:
            classify(response, classes, mv.labels, mv.config.max_batch_size > 0)
        if targets:
            write_outputs(response, targets)

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        if not self.accepting:
            raise Unavailable("server is shutting down")
        bind_request(request)
        mv = self.manager.get(request.model_name, request.model_version)
        if not mv.decoupled:
            response = await self.infer(request)
            yield response
            return
        if LORA_PARAMETER in request.parameters and not mv.generates_text:
            mv.adapters.check(request.parameters[LORA_PARAMETER])
        wanted = {o.name for o in request.outputs}
        targets, classes = self._prepare(request)
        if mv.generates_text:
            form, inputs, chunks = self._tensor_generate(mv, request)
            responses = tensor_adapter.responses(form, inputs, chunks)
        else:
            responses = mv.stream(request)
            if self.settings.max_stream_secs:
                responses = _bounded(responses, self.settings.max_stream_secs, mv.name)
        async with contextlib.aclosing(responses):
            async for response in responses:
                if wanted:
                    response.outputs = [t for t in response.outputs if t.name in wanted]
                    # each response of a stream lands in the same region (the client reads it before the next)
                    self._finish(response, mv, targets, classes)
                yield response

    # ---- text generation (the typed LLM contract, `llm.contract`) -----------------------------
    async def generate(self, model: str, version: str, inputs: GenerateInputs) -> AsyncIterator[TextChunk]:
        """A text-generation model's chunks for `inputs`: the adapter and the limits checked first
        (InvalidInput naming the field), then admitted, counted and traced as every stream is. A model
        without `generate` gets the tensor form (`tensor_adapter.tensor_request`)."""
        if not self.accepting:
            raise Unavailable("server is shutting down")
        mv = self.manager.get(model, version)
        if not mv.generates_text:  # a model speaking only the tensor form (a Python-backend LLM)
            self.generate_limits.check(inputs)
            declared = {t["name"] for t in self.model_metadata(model, version)["inputs"]}
            request = tensor_adapter.tensor_request(inputs, model, version, declared, mv.config.max_batch_size > 0)
            async with contextlib.aclosing(self.stream(request)) as responses:
                async for response in responses:
                    yield tensor_adapter.text_chunk(response)
            return
        async with contextlib.aclosing(self._generate(mv, inputs)) as chunks:
            async for chunk in chunks:
                yield chunk

    def _tensor_generate(self, mv, request: InferRequest):
        """A tensor request to a text-generation model, through the tensor adapter: (how to answer it,
        its inputs, its chunks)."""
        mv.check_request(request)
        inputs, form = tensor_adapter.read_request(request, (mv.name, str(mv.version)), mv.config)
        return form, inputs, self._generate(mv, inputs)

    def _generate(self, mv, inputs: GenerateInputs) -> AsyncIterator[TextChunk]:
        if inputs.lora_field == LORA_PARAMETER:
            mv.adapters.check(inputs.lora)
        elif inputs.lora not in mv.adapters.sources:
            loaded = ", ".join(sorted(mv.adapters.sources)) or "none"
            raise InvalidInput(f"{inputs.lora_field}: LoRA adapter '{inputs.lora}' is not loaded (loaded: {loaded})",
                               param=inputs.lora_field)
        self.generate_limits.check(inputs)
        chunks = mv.generate(inputs)
        if self.settings.max_stream_secs:
            chunks = _bounded(chunks, self.settings.max_stream_secs, mv.name)
        return chunks

    # ---- tokenizer (LLM backends that expose theirs) -----------------------------------------
    async def tokenize(self, model: str, inputs, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `inputs` (text or chat, `llm.tensor_protocol.GenerateInputs`) by the model's tokenizer."""
        return await self._first_instance(model).tokenize(inputs, add_special_tokens)

    async def detokenize(self, model: str, token_ids: list[int]) -> str:
        return await self._first_instance(model).detokenize(token_ids)

    def _first_instance(self, model: str) -> ModelInstance:
        if not self.accepting:
            raise Unavailable("server is shutting down")
        instances = self.manager.get(model).instances
        if not instances:
            raise Unavailable(f"model '{model}' has no instance")
        return instances[0]

    # ---- statistics and repository ------------------------------------------------------
    def statistics(self, name: str = "", version: str = "") -> dict:
        if name:
            if version:
                versions = [self.manager.get(name, version)]
            else:
                entry = self.manager.entries.get(name)
                if entry is None or not entry.versions:
                    raise NotFound(f"model '{name}' is not found")
                versions = list(entry.versions.values())
        else:
            versions = [mv for e in self.manager.entries.values() for mv in e.versions.values() if mv.is_ready]
        return {"model_stats": [mv.stats.to_dict() for mv in sorted(versions, key=lambda m: (m.name, m.version))]}

    def engine_stats(self, name: str, version: str = "") -> list[dict]:
        """Each instance's engine occupancy (`ModelInstance.engine_stats`) of a ready version, with
        its TTFT and inter-token latency sums; empty for a model whose instances are not engines."""
        out = []
        for instance in self.manager.get(name, version).instances:
            stats = instance.engine_stats()
            if stats is None:
                continue
            sums = instance.llm_metrics.latency_sums() if instance.llm_metrics is not None else {}
            out.append({**stats.to_dict(), **sums})
        return out

    def engine_waiting(self) -> dict[tuple[str, str], int]:
        """Requests waiting inside LLM engines (`EngineStats.num_waiting`) per (model, version) of
        ready versions: the metrics count them as pending, as Triton's vLLM backend users expect."""
        waiting: dict[tuple[str, str], int] = {}
        for model, version, instance in self.ready_instances():
            stats = instance.engine_stats()
            if stats is not None and stats.num_waiting:
                waiting[(model, version)] = waiting.get((model, version), 0) + stats.num_waiting
        return waiting

    def ready_instances(self) -> Iterator[tuple[str, str, ModelInstance]]:
        """(model, version, instance) for every instance of every ready version: what a plugin's
        metric collector reads at scrape time (from the metrics thread)."""
        for entry in list(self.manager.entries.values()):
            for mv in list(entry.versions.values()):
                if mv.is_ready:
                    for instance in list(mv.instances):
                        yield mv.name, str(mv.version), instance

    def repository_index(self, ready_only: bool = False) -> list[dict]:
        return self.manager.index(ready_only)

    def _check_model_control(self) -> None:
        if self.settings.model_control_mode != "explicit":
            # Triton's code and words in both other modes (clients match them)
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled "
                              f"(model control mode '{self.settings.model_control_mode}')")

    async def load_model(self, name: str, config_json: str | None = None,
                         files: dict[str, bytes] | None = None) -> None:
        self._check_model_control()
        await self.manager.load(name, config_json, files)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._check_model_control()
        await self.manager.unload(name, unload_dependents)

    # ---- LoRA adapters (applied to every instance of the model's ready version) --------------
    async def load_adapter(self, model: str, name: str, source: str | None = None) -> None:
        """Load adapter `name` from folder `source` (absolute; None: `<model>/adapters/<name>/`).

        Allowed in every model control mode: adapters change what a loaded model serves, not which
        models are loaded. Bad input is InvalidInput and leaves nothing loaded.
        """
        entry = self._entry(model)
        async with entry.lock:
            mv = self.manager.get(model)
            mv.adapters.require_support()
            path = resolve_folder(name, source, mv.ctx.model_path, self.settings.lora_adapter_roots)
            self.manager.check_adapter_name(name, model)
            await mv.adapters.load(AdapterSource(name, path, "dynamic"))

    async def unload_adapter(self, model: str, name: str) -> None:
        """New requests for the adapter are refused at once; returns once its running requests finished."""
        check_name(name, "adapter name")
        entry = self._entry(model)
        async with entry.lock:
            await self.manager.get(model).adapters.unload(name)

    def serves_adapters(self, model: str) -> bool:
        return self.manager.get(model).adapters.supported

    def list_adapters(self, model: str) -> list[dict]:
        return self.manager.get(model).adapters.rows()

    def adapter_model(self, adapter: str) -> str | None:
        """The model serving adapter `adapter` (None when no ready model does)."""
        mv = self.manager.find_adapter(adapter)
        return None if mv is None else mv.name

    def _entry(self, model: str):
        entry = self.manager.entries.get(model)
        if entry is None:
            raise NotFound(f"model '{model}' is not found")
        return entry


async def _bounded(responses: AsyncIterator[InferResponse], seconds: float, model: str) -> AsyncIterator[InferResponse]:
    """`responses` until `seconds` have passed; then the stream is closed (the backend aborts its
    request and frees what it holds) and ends with an error."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    try:
        while True:
            try:
                response = await asyncio.wait_for(anext(responses), deadline - loop.time())
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise Unavailable(f"model '{model}': the stream ran longer than the server's limit of {seconds:g} s "
                                  "(--max-stream-secs)") from None
            yield response
    finally:
        await responses.aclose()
