"""One loaded model version: its state, its instances, and the request path through them."""
from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..core.backend import BackendSpec, InstanceContext, ModelContext, ModelInstance
from ..core.errors import InternalError, ModelplexError, Unavailable, Unsupported
from ..core.tensors import InferRequest, InferResponse
from ..observability.stats import ModelStats
from ..observability.trace_spans import current_span, share
from ..scheduling.batching import DynamicBatcher
from ..scheduling.sequence_batcher import SequenceBatcher
from ..scheduling.sequence_config import sequence_settings
from .adapters import AdapterSource, ModelAdapters, load_sources
from .classification import load_labels
from .load_threads import LoadTimeout, in_thread
from .validation import RequestValidator

if TYPE_CHECKING:
    from ..llm.contract import TextChunk
    from ..llm.tensor_protocol import GenerateInputs

log = logging.getLogger(__name__)
_now = time.perf_counter_ns
PROGRESS_EVERY_S = 30.0


def _close_late_instance(future: asyncio.Future) -> None:
    """An instance whose load had already timed out: nobody will use it."""
    if not future.cancelled() and future.exception() is None:
        log.warning("an instance finished loading after its load timed out; closing it")
        asyncio.ensure_future(future.result().close())


class ModelState(str, enum.Enum):
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"


class ModelVersion:
    """A version of a model and its pool of idle instances.

    Invariant: an instance is in `_idle` at most its `max_concurrency` (default: the spec's
    `max_concurrency_per_instance`) times, and only while no request holds that slot; `inflight`
    counts requests admitted and not yet finished.
    """

    def __init__(self, ctx: ModelContext, spec: BackendSpec, stats: ModelStats, fingerprint: str,
                 adapters: list[AdapterSource] = ()):
        self.ctx, self.spec, self.stats, self.fingerprint = ctx, spec, stats, fingerprint
        self.name, self.version = ctx.name, ctx.version
        self.config = ctx.config
        self.state = ModelState.LOADING
        self.reason = ""
        self.instances: list[ModelInstance] = []
        self.adapters = ModelAdapters(self.name, self.instances)
        self._initial_adapters = list(adapters)
        self.validator = RequestValidator(ctx.config)
        self.labels: dict[str, list[str]] = {}  # output -> classification labels, read by `load`
        self.decoupled = ctx.config.model_transaction_policy.decoupled
        # Shared by its spans (recorded by reference): never changed.
        self._span_name = share(f"infer {self.name}")
        self._span_attributes = share({"model": self.name, "version": self.version})
        self.inflight = 0
        self._idle: asyncio.Queue[ModelInstance] = asyncio.Queue()
        self._drained = asyncio.Event()
        ctx.stats = stats
        self.batcher = self._batcher(ctx, spec, stats)

    def _batcher(self, ctx: ModelContext, spec: BackendSpec, stats: ModelStats):
        """The sequence batcher, the dynamic batcher, or None (each request runs alone)."""
        config = ctx.config
        if config.HasField("sequence_batching"):
            if self.decoupled:
                raise Unsupported(f"model '{self.name}': sequence batching of decoupled models is not supported")
            return SequenceBatcher(sequence_settings(config, ctx.model_path), self.instances, stats,
                                   spec.merges_batches, tuple(self.validator.outputs))
        # Decoupled models stream per request; Triton batches only models answering once.
        if config.HasField("dynamic_batching") and not self.decoupled:
            return DynamicBatcher(config, self._idle, stats, spec.merges_batches)
        return None

    async def load(self, timeout: float | None = None, deadline: float | None = None) -> None:
        """Create every instance of every instance_group off the event loop, within `timeout`
        seconds in all (`--model-load-timeout-secs`; `deadline`, on `time.monotonic()`, when the load
        began earlier); on failure the instances made so far close."""
        self._loop = asyncio.get_running_loop()
        start = time.perf_counter()
        if deadline is None and timeout is not None:
            deadline = time.monotonic() + timeout
        ticker = asyncio.ensure_future(self._still_loading())
        try:
            self.labels = await asyncio.to_thread(load_labels, self.config, self.ctx.model_path)
            contexts = self._instance_contexts()
            for number, ictx in enumerate(contexts, 1):
                self.report_progress(f"creating instance {ictx.name} ({number}/{len(contexts)})")
                instance = await self._create_instance(ictx, deadline, timeout)
                self.instances.append(instance)
                slots = getattr(instance, "max_concurrency", None) or self.spec.max_concurrency_per_instance
                for _ in range(max(1, slots)):
                    self._idle.put_nowait(instance)
        except BaseException:
            await self._close_instances()
            raise
        finally:
            ticker.cancel()
        if self._initial_adapters:
            try:
                await load_sources(self.adapters, self._initial_adapters)
            except BaseException:
                await self.unload(0)  # a failed load leaves no engine running
                raise
        if self.batcher is not None:
            self.batcher.start(len(self.instances))
        self.stats.load_seconds = time.perf_counter() - start
        if self.state is ModelState.LOADING:  # not if an instance already died
            self.state, self.reason = ModelState.READY, ""
            log.info("model %s version %s ready in %.1f s", self.name, self.version, self.stats.load_seconds)

    async def _create_instance(self, ictx: InstanceContext, deadline: float | None, timeout: float | None):
        """`create_instance` on a thread of its own: a load that hangs holds only that thread, never
        the shared pool. Past the deadline the load fails and is cancelled (`ictx.cancel`: the backend
        stops what it started); should the instance still appear later, it is closed at once."""
        try:
            return await in_thread(lambda: self.spec.create_instance(ictx), ictx.name, deadline,
                                   f"model '{self.name}' version {self.version} did not finish loading within "
                                   f"{timeout:g} s (--model-load-timeout-secs)" if timeout else "",
                                   backend=self.spec.name if self.spec.first_use_alone else None, warms=True,
                                   cancel=ictx.cancel, on_late=_close_late_instance)
        except LoadTimeout as e:
            raise Unavailable(e.message) from None

    def _instance_contexts(self) -> list[InstanceContext]:
        from tritonclient.grpc import model_config_pb2 as pb

        contexts = []
        for group_index, group in enumerate(self.config.instance_group):
            kind = pb.ModelInstanceGroup.Kind.Name(group.kind).removeprefix("KIND_")
            gpus = list(group.gpus) or [0]
            name = group.name or f"{self.name}_{group_index}"
            for device_id in gpus if kind == "GPU" else [0]:
                for i in range(max(1, group.count)):
                    contexts.append(InstanceContext(self.ctx, f"{name}_{i}", len(contexts), kind, device_id,
                                                    report_failure=self._report_failure,
                                                    report_progress=self.report_progress))
        return contexts

    async def _still_loading(self) -> None:
        """A long load (kernels compiling, weights streaming) says so every `PROGRESS_EVERY_S`, with
        the last step its backend reported, so a log that goes quiet is not mistaken for a hang."""
        start = time.monotonic()
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            log.info("model %s version %s still loading after %.0f s%s", self.name, self.version,
                     time.monotonic() - start, f" (last: {self.reason})" if self.reason else "")

    def report_progress(self, message: str) -> None:
        """A loading step done (any thread): logged, and the LOADING version's reason meanwhile."""
        log.info("model %s version %s loading: %s", self.name, self.version, message)
        if self.state is ModelState.LOADING:
            self.reason = message  # one attribute store: safe from the loading thread

    def _report_failure(self, reason: str) -> None:
        """An instance died (any thread): refuse requests with `reason` until the model is reloaded."""
        self._loop.call_soon_threadsafe(self.fail, reason)

    def fail(self, reason: str) -> None:
        """Refuse requests with `reason` until the model is reloaded (on the event loop)."""
        if self.state in (ModelState.LOADING, ModelState.READY):
            log.error("model %s version %s is unavailable: %s", self.name, self.version, reason)
            self.state, self.reason = ModelState.UNAVAILABLE, reason

    @property
    def is_ready(self) -> bool:
        return self.state is ModelState.READY

    def _admit(self) -> None:
        if self.state is not ModelState.READY:
            raise Unavailable(f"model '{self.name}' version {self.version} is not ready")
        self.inflight += 1

    def _release(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._drained.set()

    async def _instance(self) -> ModelInstance:
        """An idle instance; meanwhile the request counts as pending (Triton: awaiting execution)."""
        stats = self.stats
        stats.pending += 1
        try:
            return await self._idle.get()
        finally:
            stats.pending -= 1

    def _check(self, request: InferRequest, start: int) -> int:
        try:
            return self.validator.check(request)
        except ModelplexError:
            self.stats.record_request(False, _now() - start, 0, 0, 0, 0, "OTHER")
            raise

    async def infer(self, request: InferRequest, span=None) -> InferResponse:
        # Untraced requests pay one read. In a sampled request a model that calls others runs in a
        # live span they nest under (coming back here inside it); any other model's span is added
        # to its caller's when it is done, from the times taken anyway (no span object, no second
        # call: ~2 us less a traced request on `simple`).
        caller = None
        if span is None and (caller := current_span.get()) is not None and self.spec.calls_models:
            with caller.child(self._span_name, self._span_attributes) as span:
                return await self.infer(request, span)
        if self.batcher is not None:
            return await self._infer_batched(request, span, caller)
        start = _now()
        try:  # free unless raised (3.11): only a traced model's failure is recorded here
            batch = self._check(request, start)
            self._admit()
            queue_ns = infer_ns = 0
            try:
                instance = await self._instance()
                t_exec = _now()
                queue_ns = t_exec - start
                try:
                    responses = await instance.execute([request])
                finally:
                    self._idle.put_nowait(instance)
                infer_ns = _now() - t_exec
                if len(responses) != 1:
                    raise InternalError(f"model '{self.name}' returned {len(responses)} responses for 1 request")
                response = responses[0]
                self.stats.record_execution(batch, 0, infer_ns, 0)
                if isinstance(response, BaseException):
                    raise response
                response.model_name, response.model_version, response.id = self.name, str(self.version), request.id
                self.stats.record_request(True, _now() - start, queue_ns, 0, infer_ns, 0)
                if span is not None:
                    span.phases(start, t_exec, t_exec + infer_ns, batch, response.phases)
                elif caller is not None:
                    caller.model_span(self._span_name, self._span_attributes, start, t_exec, t_exec + infer_ns, batch,
                                      response.phases)
                return response
            except asyncio.CancelledError:  # the client went away
                self.stats.record_request(False, _now() - start, queue_ns, 0, infer_ns, 0, "CANCELED")
                raise
            except ModelplexError:
                self.stats.record_request(False, _now() - start, queue_ns, 0, infer_ns, 0, "BACKEND")
                raise
            except Exception as e:
                self.stats.record_request(False, _now() - start, queue_ns, 0, infer_ns, 0, "BACKEND")
                log.exception("model %s version %s failed", self.name, self.version)
                raise InternalError(f"model '{self.name}' version {self.version} failed: {e}") from e
            finally:
                self._release()
        except BaseException as e:
            if caller is not None:
                caller.model_span_failed(self._span_name, self._span_attributes, start, e)
            raise

    async def _infer_batched(self, request: InferRequest, span, caller) -> InferResponse:
        """The dynamic batcher's path: queued, run with other requests, split back by the backend."""
        start = _now()
        try:  # as in `infer`
            batch = self._check(request, start)
            self._admit()
            try:
                pending = await self.batcher.run(request, batch, start)
                response = pending.future.result()
                response.model_name, response.model_version, response.id = self.name, str(self.version), request.id
                self.stats.record_request(True, _now() - start, pending.queue_ns, 0, pending.infer_ns, 0)
                t_exec = start + pending.queue_ns
                if span is not None:
                    span.phases(start, t_exec, t_exec + pending.infer_ns, pending.batch_total, response.phases)
                elif caller is not None:
                    caller.model_span(self._span_name, self._span_attributes, start, t_exec,
                                      t_exec + pending.infer_ns, pending.batch_total, response.phases)
                return response
            except asyncio.CancelledError:  # the client went away
                self.stats.record_request(False, _now() - start, 0, 0, 0, 0, "CANCELED")
                raise
            except ModelplexError as e:
                # Queue full or timed out: Triton counts these as REJECTED.
                reason = "REJECTED" if isinstance(e, Unavailable) else "BACKEND"
                self.stats.record_request(False, _now() - start, 0, 0, 0, 0, reason)
                raise
            finally:
                self._release()
        except BaseException as e:
            if caller is not None:
                caller.model_span_failed(self._span_name, self._span_attributes, start, e)
            raise

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """Responses of a decoupled model as the backend produces them."""
        start = _now()
        self._check(request, start)

        def own(response: InferResponse) -> None:
            response.model_name, response.model_version, response.id = self.name, str(self.version), request.id

        async with contextlib.aclosing(self._streamed(start, lambda instance: instance.stream(request), own)) as items:
            async for response in items:
                yield response

    def check_request(self, request: InferRequest) -> None:
        """The tensor checks `infer` and `stream` make (a failure counts in the statistics)."""
        self._check(request, _now())

    async def generate(self, inputs: GenerateInputs) -> AsyncIterator[TextChunk]:
        """A text-generation model's chunks (`ModelInstance.generate`), counted and traced as a stream."""
        items = self._streamed(_now(), lambda instance: instance.generate(inputs), None)
        async with contextlib.aclosing(items):
            async for chunk in items:
                yield chunk

    async def _streamed(self, start: int, open_stream, own) -> AsyncIterator:
        """What `open_stream(instance)` yields (responses or chunks) on an idle instance, admitted,
        counted in the statistics and traced (a span per stream, an event per item, the backend's phases)."""
        self._admit()
        ok, reason = False, "BACKEND"
        parent = current_span.get()
        span = None if parent is None else parent.child(f"stream {self.name}", {"model": self.name})
        num_items = 0
        try:
            instance = await self._instance()
            queue_ns = _now() - start
            try:
                async with contextlib.aclosing(open_stream(instance)) as items:
                    async for item in items:
                        if own is not None:
                            own(item)
                        if span is not None:
                            span.response_event(num_items, start)
                            if item.phases:
                                span.backend_phases(item.phases)
                        num_items += 1
                        yield item
            finally:
                self._idle.put_nowait(instance)
            ok = True
            self.stats.record_execution(1, 0, _now() - start - queue_ns, 0)
        except (asyncio.CancelledError, GeneratorExit):  # the client went away or closed the stream
            reason = "CANCELED"
            raise
        finally:
            self.stats.record_request(ok, _now() - start, 0, 0, 0, 0, reason)
            self._release()
            if span is not None:
                span.end()

    @property
    def generates_text(self) -> bool:
        """Whether its instances implement `generate` (the data plane adapts tensor requests onto it)."""
        return bool(self.instances) and self.instances[0].generates_text

    async def unload(self, timeout: float) -> None:
        """Refuse new requests, wait (up to `timeout` s) for in-flight ones, then close instances."""
        self.state = ModelState.UNLOADING
        if self.inflight:
            self._drained.clear()
            try:
                await asyncio.wait_for(self._drained.wait(), timeout)
            except TimeoutError:
                log.warning("model %s version %s: %d requests still running after %.0fs; unloading anyway",
                            self.name, self.version, self.inflight, timeout)
        if self.batcher is not None:
            self.batcher.close()
        await self._close_instances()
        self.state, self.reason = ModelState.UNAVAILABLE, "unloaded"

    async def _close_instances(self) -> None:
        for instance in self.instances:
            try:
                await instance.close()
            except Exception:
                log.exception("model %s version %s: close failed", self.name, self.version)
        self.instances.clear()
        self.adapters.sources.clear()
