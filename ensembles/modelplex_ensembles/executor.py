"""Runs an ensemble request: each step as soon as its input tensors exist, through the data plane.

Steps call the data plane like any client, so a step model keeps its own batching, queue
policies and statistics; independent branches run concurrently as asyncio tasks.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from modelplex import (
    InferRequest,
    InferResponse,
    InferTensor,
    InstanceContext,
    InternalError,
    ModelInstance,
    ModelplexError,
    RequestedOutput,
    Unavailable,
    current_span,
)

from .dag import Ensemble, EnsembleStep, build

_now = time.perf_counter_ns


class EnsembleInstance(ModelInstance):
    """Holds no per-request state, so the host may run many requests through one instance at once."""

    def __init__(self, ictx: InstanceContext):
        ctx = ictx.model
        if ctx.dataplane is None:
            raise InternalError(f"ensemble '{ctx.name}' needs the host's data plane, which was not given")
        self.dataplane, self.stats = ctx.dataplane, ctx.stats
        self.ensemble: Ensemble = build(ctx.config, ctx.dataplane.model_config)
        self._streaming = self.ensemble.streaming_step
        self._batch_steps = tuple(s for s in self.ensemble.steps if s is not self._streaming)

    async def execute(self, requests: list[InferRequest]) -> list[InferResponse | ModelplexError]:
        if len(requests) == 1:
            return [await self._infer(requests[0])]
        # Each request's failure (always a ModelplexError naming the step) is its own.
        return list(await asyncio.gather(*(self._infer(r) for r in requests), return_exceptions=True))

    async def _infer(self, request: InferRequest) -> InferResponse:
        tensors = await self._run_steps(request, self._batch_steps)
        return InferResponse(self.ensemble.name, "", self._outputs(tensors))

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """Run every other step, then relay the decoupled last step's responses as the ensemble's."""
        step = self._streaming
        tensors = await self._run_steps(request, self._batch_steps)
        try:
            async for response in self.dataplane.stream(self._step_request(step, request, tensors)):
                tensors.update(self._step_outputs(step, response))
                yield InferResponse(self.ensemble.name, "", self._outputs(tensors), parameters=response.parameters)
        except Exception as e:
            raise self._step_error(step, e) from e

    def _outputs(self, tensors: dict[str, InferTensor]) -> list[InferTensor]:
        return [tensors[name] for name in self.ensemble.output_names if name in tensors]

    # ---- steps --------------------------------------------------------------------------
    async def _run_steps(self, request: InferRequest, steps: tuple[EnsembleStep, ...]) -> dict[str, InferTensor]:
        tensors = {t.name: t for t in request.inputs}
        waiting = list(steps)
        running: dict[asyncio.Task, EnsembleStep] = {}
        try:
            while waiting or running:
                ready = [s for s in waiting if all(t in tensors for t in s.input_map.values())]
                for step in ready:
                    waiting.remove(step)
                if len(ready) == 1 and not running:  # a chain: no task needed
                    tensors.update(await self._call(ready[0], request, tensors))
                    continue
                for step in ready:
                    running[asyncio.create_task(self._call(step, request, tensors))] = step
                if not running:  # only when an optional ensemble input a step reads is absent
                    raise InternalError(f"ensemble '{self.ensemble.name}': {waiting[0].label} never got "
                                        "all its input tensors (an optional ensemble input is missing)")
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    del running[task]
                errors = [task.exception() for task in done if task.exception() is not None]
                if errors:
                    raise errors[0]
                for task in done:
                    tensors.update(task.result())
        finally:
            for task in running:
                task.cancel()
        return tensors

    async def _call(self, step: EnsembleStep, request: InferRequest,
                    tensors: dict[str, InferTensor]) -> dict[str, InferTensor]:
        start = _now()
        try:
            parent = current_span.get()
            if parent is None:
                response = await self.dataplane.infer(self._step_request(step, request, tensors))
            else:
                with parent.child(f"step {step.number} {step.model_name}", {"ensemble": self.ensemble.name}):
                    response = await self.dataplane.infer(self._step_request(step, request, tensors))
        except Exception as e:
            raise self._step_error(step, e) from e
        if self.stats is not None:
            self.stats.record_step(f"{step.number}:{step.model_name}", _now() - start)
        return self._step_outputs(step, response)

    @staticmethod
    def _step_request(step: EnsembleStep, request: InferRequest, tensors: dict[str, InferTensor]) -> InferRequest:
        inputs = []
        for model_input, tensor_name in step.input_map.items():
            t = tensors.get(tensor_name)
            if t is not None:
                inputs.append(InferTensor(model_input, t.datatype, list(t.shape), t.data))
        outputs = [RequestedOutput(name) for name in step.output_map]
        return InferRequest(step.model_name, inputs, step.model_version, request.id, outputs)

    @staticmethod
    def _step_outputs(step: EnsembleStep, response: InferResponse) -> dict[str, InferTensor]:
        produced = {}
        for t in response.outputs:
            name = step.output_map.get(t.name)
            if name is not None:
                produced[name] = InferTensor(name, t.datatype, t.shape, t.data)
        return produced

    def _step_error(self, step: EnsembleStep, error: Exception) -> ModelplexError:
        """Unavailable stays 503 (the client may retry); any other step failure is the ensemble's 500."""
        message = error.message if isinstance(error, ModelplexError) else f"{type(error).__name__}: {error}"
        message = f"ensemble '{self.ensemble.name}' {step.label} failed: {message}"
        if isinstance(error, Unavailable):
            return Unavailable(message, error.retry_after)
        return InternalError(message)
