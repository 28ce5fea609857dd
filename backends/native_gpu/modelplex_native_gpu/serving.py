"""The modelplex ModelInstance over an AsyncLLMEngine: request tensors in, text out (whole or streamed)."""
from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from collections.abc import AsyncIterator

import numpy as np
from modelplex import (InferRequest, InferResponse, InferTensor, InstanceContext, InvalidInput, ModelContext,
                       ModelInstance)

from .config import EngineConfig
from .errors import EngineError

log = logging.getLogger(__name__)

_INT_FIELDS = ("block_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes", "max_model_len",
               "num_threads", "seed")
_request_ids = itertools.count()


def engine_config(ctx: ModelContext, device: str | None) -> EngineConfig:
    """EngineConfig from the weights location and config.pbtxt `parameters`; unknown keys are errors."""
    model = ctx.version_path / "model.gguf"
    if not model.is_file():
        model = ctx.version_path
    fields = {f.name for f in dataclasses.fields(EngineConfig)} - {"model"}
    settings = {}
    for key, value in ctx.parameters.items():
        if key not in fields:
            raise InvalidInput(f"model '{ctx.name}': unknown parameter '{key}' (known: {sorted(fields)})")
        try:
            if key in _INT_FIELDS:
                settings[key] = int(value)
            elif key == "gpu_memory_utilization":
                settings[key] = float(value)
            elif key == "enable_prefix_caching":
                settings[key] = value.strip().lower() in ("1", "true", "yes", "on")
            else:
                settings[key] = value
        except ValueError:
            raise InvalidInput(f"model '{ctx.name}': parameter '{key}' is not a number: {value!r}") from None
    settings.setdefault("device", device)
    try:
        return EngineConfig(model=str(model), **settings)
    except EngineError as exc:
        raise InvalidInput(f"model '{ctx.name}': {exc}") from None


def auto_complete_config(ctx: ModelContext) -> None:
    """Declare text_input / sampling_parameters / text_output when config.pbtxt lists no tensors."""
    from tritonclient.grpc import model_config_pb2 as pb

    config = ctx.config
    if not config.input:
        for name, optional in (("text_input", False), ("sampling_parameters", True)):
            tensor = config.input.add(name=name, data_type=pb.TYPE_STRING, dims=[1])
            tensor.optional = optional
    if not config.output:
        config.output.add(name="text_output", data_type=pb.TYPE_STRING, dims=[-1])


class LLMInstance(ModelInstance):
    """One engine per instance; the host may hand it many requests at once (they batch inside)."""

    def __init__(self, ictx: InstanceContext):
        from .engine.async_engine import AsyncLLMEngine
        from .engine.llm_engine import LLMEngine

        device = "cuda:%d" % ictx.device_id if ictx.kind == "GPU" else ("cpu" if ictx.kind == "CPU" else None)
        try:
            self.engine = AsyncLLMEngine(LLMEngine(engine_config(ictx.model, device)))
        except EngineError as exc:
            raise InvalidInput(f"model '{ictx.model.name}': {exc}") from None
        self.model_name, self.model_version = ictx.model.name, str(ictx.model.version)

    async def execute(self, requests: list[InferRequest]) -> list[InferResponse]:
        import asyncio

        return list(await asyncio.gather(*(self._complete(r) for r in requests)))

    async def _complete(self, request: InferRequest) -> InferResponse:
        text, reason = "", None
        async for output in self._generate(request):
            text, reason = output.text, output.finish_reason
        return self._response(request, text, reason)

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        async for output in self._generate(request):
            if output.text_delta or output.finished:
                yield self._response(request, output.text_delta, output.finish_reason)

    async def _generate(self, request: InferRequest):
        prompt, params = _parse(request)
        try:
            async for output in self.engine.generate(f"{request.id or 'req'}-{next(_request_ids)}", prompt, params):
                yield output
        except EngineError as exc:  # raised on the first step of the stream, before any output
            raise InvalidInput(str(exc)) from None

    def _response(self, request: InferRequest, text: str, reason: str | None) -> InferResponse:
        out = InferTensor.from_numpy("text_output", np.array([text.encode()], dtype=np.object_))
        return InferResponse(self.model_name, self.model_version, [out], id=request.id,
                             parameters={"finish_reason": reason} if reason else {})

    async def close(self) -> None:
        self.engine.shutdown()


def _parse(request: InferRequest) -> tuple[str, dict]:
    prompt = _first_string(request.input("text_input"))
    params = {}
    if any(t.name == "sampling_parameters" for t in request.inputs):
        try:
            params = json.loads(_first_string(request.input("sampling_parameters")))
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"sampling_parameters: not JSON ({exc.msg})") from None
        if not isinstance(params, dict):
            raise InvalidInput("sampling_parameters: must be a JSON object")
    return prompt, params


def _first_string(tensor: InferTensor) -> str:
    value = tensor.data.reshape(-1)[0] if tensor.data.size else b""
    return value.decode() if isinstance(value, bytes) else str(value)
