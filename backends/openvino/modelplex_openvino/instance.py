"""One model instance: a model compiled for one OpenVINO device, and a pool of infer requests over it.

Each infer request runs on its own thread (OpenVINO releases the GIL while it infers), so as many
requests run at once as the compiled model has infer requests, which is what its streams can use.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from modelplex import (
    InferRequest,
    InferResponse,
    InferTensor,
    InstanceContext,
    InternalError,
    InvalidInput,
    ModelInstance,
    ModelplexError,
    check_config,
)

from .devices import configured_device, select_device, shared_core
from .properties import check_precision, compile_properties, is_yes
from .signature import MODEL_FORMAT, model_signature, openvino_reason, read_model
from .static_shapes import make_static, needs_static_shapes, reshape_to_config

log = logging.getLogger(__name__)

# The most infer requests one instance pools, and what the BackendSpec declares; each instance then
# tells the host its own number (`max_concurrency`): the compiled model's optimal number of requests.
MAX_CONCURRENCY = 32


@dataclass(frozen=True, slots=True)
class _OutputSpec:
    index: int  # the compiled model's output port
    datatype: str
    dims: tuple[int, ...] | None  # what clients see when config.pbtxt reshapes the output, else None

    @property
    def is_string(self) -> bool:
        return self.datatype == "BYTES"


def compile_model(ictx: InstanceContext):
    """(device, compiled model, model inputs, model outputs) for one instance: the device chosen and
    checked, the config checked against the model, the properties from `parameters` applied."""
    ctx, config = ictx.model, ictx.model.config
    core = shared_core()
    configured = configured_device(ictx)
    device = select_device(configured, core.available_devices, ctx.name)
    if device != configured:
        log.warning("model %s: %s falls back to %s (the other devices are absent)", ctx.name, configured, device)
    properties = compile_properties(ctx)
    check_precision(properties.get("INFERENCE_PRECISION_HINT", ""), device, core, ctx.name)
    model = read_model(core, ctx)
    inputs, outputs = model_signature(model, ctx.name)
    check_config(config, inputs, outputs, MODEL_FORMAT)
    if needs_static_shapes(device):
        make_static(model, config, f"device {device}")
    elif is_yes(ctx.parameters, "RESHAPE_IO_LAYERS"):
        reshape_to_config(model, config)
    try:
        return device, core.compile_model(model, device, properties), inputs, outputs
    except RuntimeError as e:
        raise InvalidInput(f"model '{ctx.name}': OpenVINO cannot compile it for {device}: "
                           f"{openvino_reason(e)}") from None


class OpenVINOInstance(ModelInstance):
    """Invariant: an infer request serves one request at a time and is back in `_idle` only after its
    outputs were copied out (the next run overwrites them)."""

    def __init__(self, ictx: InstanceContext):
        config = ictx.model.config
        self.model_name, self.max_batch_size = ictx.model.name, config.max_batch_size
        self.device, self.compiled_model, inputs, outputs = compile_model(ictx)
        self._input_index = {s.name: i for i, s in enumerate(inputs)}
        self._string_inputs = frozenset(s.name for s in inputs if s.datatype == "BYTES")
        # A static batch (NPU) takes smaller batches padded up to it.
        self._static_batch = self.max_batch_size if needs_static_shapes(self.device) else 0
        model_outputs = {s.name: (i, s) for i, s in enumerate(outputs)}
        self._outputs = {t.name: _OutputSpec(model_outputs[t.name][0], model_outputs[t.name][1].datatype,
                                             tuple(t.dims) if t.HasField("reshape") else None)
                         for t in config.output}
        self._output_names = list(self._outputs)
        optimal = int(self.compiled_model.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self.num_requests = min(MAX_CONCURRENCY, optimal)
        self.max_concurrency = self.num_requests  # the host queues the rest, where its statistics see them
        self._idle: asyncio.Queue = asyncio.Queue()
        for _ in range(self.num_requests):
            self._idle.put_nowait(self.compiled_model.create_infer_request())
        self._executor = ThreadPoolExecutor(self.num_requests, thread_name_prefix=f"openvino-{ictx.name}")
        log.info("model %s instance %s: on %s, %d infer requests, %s streams, precision %s%s", self.model_name,
                 ictx.name, self.device, self.num_requests, self._property("NUM_STREAMS"),
                 self._property("INFERENCE_PRECISION_HINT"),
                 ", loaded from the cache" if self.loaded_from_cache else "")

    def _property(self, key: str) -> str:
        """A compiled model's property for the log; virtual devices (AUTO) answer only some."""
        try:
            value = self.compiled_model.get_property(key)
        except RuntimeError:
            return "?"
        return value.get_type_name() if hasattr(value, "get_type_name") else str(value)

    @property
    def loaded_from_cache(self) -> bool:
        """The compiled model came from `CACHE_DIR` instead of being compiled again."""
        return self._property("LOADED_FROM_CACHE") == "True"

    async def execute(self, requests: list[InferRequest]) -> list[InferResponse | ModelplexError]:
        """One run per request, concurrently over the infer requests (the host merges a dynamic
        batch into one request beforehand); a request's own error is its entry."""
        if len(requests) == 1:
            return [await self._infer(requests[0])]
        results = await asyncio.gather(*(self._infer(r) for r in requests), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, ModelplexError):
                raise result
        return results

    async def _infer(self, request: InferRequest) -> InferResponse:
        infer_request = await self._idle.get()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._run, infer_request, request)
        finally:
            self._idle.put_nowait(infer_request)

    async def close(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, True)
        self._idle = None  # the last references to the infer requests and the compiled model
        self.compiled_model = None

    # ---- on a pool thread ---------------------------------------------------------------
    def _run(self, infer_request, request: InferRequest) -> InferResponse:
        batch = request.inputs[0].data.shape[0] if self.max_batch_size > 0 and request.inputs else 0
        feeds = {self._input_index[t.name]: self._padded(self._feed(t), batch) for t in request.inputs}
        try:
            # share_inputs: OpenVINO reads the request's arrays in place (read-only ones too, as gRPC's are).
            infer_request.infer(feeds, share_inputs=True)
        except RuntimeError as e:
            raise InternalError(f"model '{self.model_name}': OpenVINO failed: {openvino_reason(e)}") from None
        names = [o.name for o in request.outputs] if request.outputs else self._output_names
        return InferResponse(self.model_name, "", [self._output(name, infer_request, batch) for name in names])

    def _feed(self, tensor: InferTensor) -> np.ndarray:
        if tensor.name not in self._string_inputs:
            return tensor.data
        # OpenVINO's string tensors take fixed-width bytes arrays (which drop trailing NUL bytes);
        # BYTES arrive as an object array of bytes.
        return np.array(list(tensor.data.flat), dtype=np.bytes_).reshape(tensor.data.shape)

    def _padded(self, data: np.ndarray, batch: int) -> np.ndarray:
        if not self._static_batch or batch == self._static_batch:
            return data
        padding = np.zeros((self._static_batch - batch, *data.shape[1:]), data.dtype)
        return np.concatenate([data, padding])

    def _output(self, name: str, infer_request, batch: int) -> InferTensor:
        spec = self._outputs[name]
        tensor = infer_request.get_output_tensor(spec.index)
        if spec.is_string:
            array = np.array(tensor.bytes_data, dtype=np.object_).reshape(tuple(tensor.shape))
        else:
            array = np.array(tensor.data)  # a copy: the next run reuses the memory
        if self._static_batch:
            array = array[:batch]
        if spec.dims is not None:
            array = array.reshape(array.shape[:1 if self.max_batch_size > 0 else 0] + spec.dims)
        return InferTensor(name, spec.datatype, list(array.shape), array)
