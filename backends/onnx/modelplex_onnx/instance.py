"""One model instance: an ONNX Runtime session, and the thread that keeps its runs off the event loop."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

from modelplex import (
    InferRequest,
    InferResponse,
    InferTensor,
    InstanceContext,
    InternalError,
    InvalidInput,
    ModelInstance,
    ModelplexError,
    answer_each,
    check_config,
)

from .session import create_session
from .signature import MODEL_FORMAT, session_signature

# Handing a run to the instance thread and back costs ~40-130 us here (two thread wake-ups), ten
# times what a tiny model's run takes; runs that short are cheaper done on the event loop itself.
INLINE_RUN_NS = 100_000


@dataclass(frozen=True, slots=True)
class _OutputSpec:
    datatype: str
    is_string: bool
    dims: tuple[int, ...] | None  # what clients see when config.pbtxt reshapes the output, else None


class OnnxInstance(ModelInstance):
    """Invariant: runs never overlap (the host never calls one instance concurrently).

    A run goes to `_executor`'s single thread, where ORT releases the GIL and the event loop keeps
    serving; only while a run's estimated cost is under `INLINE_RUN_NS` do runs happen on the loop
    directly. The estimate falls to any faster run at once and at most doubles per slower one, so a
    run stretched by preemption barely moves it, while a model that really is slow goes back to
    the thread within a few runs.
    """

    def __init__(self, ictx: InstanceContext):
        config = ictx.model.config
        self.model_name = ictx.model.name
        self.session = create_session(ictx)
        inputs, outputs = session_signature(self.session)
        check_config(config, inputs, outputs, MODEL_FORMAT)
        self.max_batch_size = config.max_batch_size
        self._string_inputs = frozenset(s.name for s in inputs if s.datatype == "BYTES")
        model_outputs = {s.name: s for s in outputs}
        self._outputs = {
            t.name: _OutputSpec(model_outputs[t.name].datatype, model_outputs[t.name].datatype == "BYTES",
                                tuple(t.dims) if t.HasField("reshape") else None)
            for t in config.output}
        self._output_names = list(self._outputs)  # the default when a request names no outputs
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"onnx-{ictx.name}")
        self._run_ns_estimate: int | None = None  # None until the first run (made on the thread)

    async def execute(self, requests: list[InferRequest]) -> list[InferResponse | ModelplexError]:
        estimate = self._run_ns_estimate
        if estimate is not None and estimate < INLINE_RUN_NS:
            return self._execute(requests)
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._execute, requests)

    async def close(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, True)
        self.session = None

    # ---- on the instance's thread (or inline, for runs under INLINE_RUN_NS) --------------
    def _execute(self, requests: list[InferRequest]) -> list[InferResponse | ModelplexError]:
        """One run per request (the host merges a dynamic batch into one request beforehand); a
        request's own error is its entry, so the others still get their answers."""
        return answer_each(requests, self._execute_one)

    def _execute_one(self, request: InferRequest) -> InferResponse:
        names = [o.name for o in request.outputs] if request.outputs else self._output_names
        feeds = {t.name: self._feed(t.name, t.data) for t in request.inputs}
        results = self._run(names, feeds)
        return InferResponse(self.model_name, "", [self._output(n, a) for n, a in zip(names, results)])

    def _run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        start = time.perf_counter_ns()
        try:
            results = self.session.run(names, feeds)
        except InvalidArgument as e:
            raise InvalidInput(f"model '{self.model_name}': {e}") from None
        except Exception as e:  # ORT's RuntimeException / Fail: a kernel failed on this data
            raise InternalError(f"model '{self.model_name}': onnxruntime failed: {e}") from None
        elapsed = time.perf_counter_ns() - start
        estimate = self._run_ns_estimate
        self._run_ns_estimate = elapsed if estimate is None else min(elapsed, 2 * estimate)
        return results

    def _feed(self, name: str, data: np.ndarray) -> np.ndarray:
        if name not in self._string_inputs:
            return data
        # ORT's string tensors take Python str (it encodes them as UTF-8); BYTES arrive as bytes.
        try:
            text = [v.decode() if isinstance(v, bytes) else str(v) for v in data.flat]
        except UnicodeDecodeError as e:
            raise InvalidInput(f"input '{name}' holds bytes that are not UTF-8 text, which ONNX string "
                               f"tensors need: {e}") from None
        return np.array(text, dtype=np.object_).reshape(data.shape)

    def _output(self, name: str, array: np.ndarray) -> InferTensor:
        spec = self._outputs[name]
        if spec.is_string:
            array = np.array([s.encode() for s in array.flat], dtype=np.object_).reshape(array.shape)
        if spec.dims is not None:
            array = array.reshape(array.shape[:1 if self.max_batch_size > 0 else 0] + spec.dims)
        return InferTensor(name, spec.datatype, list(array.shape), array)
