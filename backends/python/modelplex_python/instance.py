"""One Python model instance as the host sees it: requests out to its worker process, responses back.

A call waits at most `execute_timeout_secs` (config parameter, default 300) for its worker; past
that the worker counts as hung and is killed. When a worker dies, its calls fail with a 500 naming
the model and the host is told, so the model reports UNAVAILABLE with the reason until reloaded.
"""
from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import subprocess
from collections.abc import AsyncIterator

from modelplex import (
    InferRequest,
    InferResponse,
    InferTensor,
    InstanceContext,
    InternalError,
    InvalidInput,
    ModelInstance,
    ModelplexError,
    NotFound,
    Unavailable,
    Unsupported,
)

from .config import worker_init
from .process import WorkerProcess
from .protocol import decode_tensor, encode_tensor
from .server_calls import serve_bls, serve_control

log = logging.getLogger(__name__)
DEFAULT_EXECUTE_TIMEOUT_SECS = 300.0
# Streams one decoupled instance takes at once. Its worker still runs one execute at a time, but
# responses of earlier requests keep flowing meanwhile, as in Triton (a bound, not a Triton setting).
DECOUPLED_MAX_CONCURRENCY = 64
FINALIZE_TIMEOUT_SECS = 30.0
# pb_utils.TritonError codes -> the host's errors (anything else is a 500).
ERRORS_BY_CODE = {2: NotFound, 3: InvalidInput, 4: Unavailable, 5: Unsupported}


class PythonInstance(ModelInstance):
    """Invariant: `_calls` holds exactly the calls sent to the worker and not yet answered; a future
    (execute) or a queue (stream) per call id. All of it is touched on the event loop only.
    A decoupled instance holds `_execute_lock` from sending an execute until the worker returns
    from it, so each execute's timeout counts its own time, not a queue in the worker."""

    def __init__(self, ictx: InstanceContext):
        model = ictx.model
        self.model_name, self.title = model.name, ictx.name
        self.decoupled = model.config.model_transaction_policy.decoupled
        if self.decoupled:
            self.max_concurrency = DECOUPLED_MAX_CONCURRENCY
        self._execute_lock = asyncio.Lock()
        self.execute_timeout = float(model.parameters.get("execute_timeout_secs") or DEFAULT_EXECUTE_TIMEOUT_SECS)
        self.dataplane = model.dataplane
        self._output_types = {t.name: t for t in _output_datatypes(model.config)}
        # Implicit state outputs: the host's sequence batcher takes them back from the response.
        self._state_outputs = {s.output_name for s in model.config.sequence_batching.state}
        self._report_failure = ictx.report_failure
        self._calls: dict[int, asyncio.Future | asyncio.Queue] = {}
        self._max_batch_size = model.config.max_batch_size
        self._bls_tasks: set[asyncio.Task] = set()  # held here: the loop keeps only weak references
        self._execute_context: contextvars.Context | None = None
        self._call_ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None  # known once the first call arrives
        self._dead_reason: str | None = None
        init, timeout = worker_init(ictx)
        try:
            self.worker = WorkerProcess.launch(self.title, init, timeout, self._on_message, self._on_exit,
                                                  ictx.cancel.on_cancel)
        except RuntimeError as e:
            raise InvalidInput(f"model '{self.model_name}': {e}") from None

    # ---- the host's side ------------------------------------------------------------------
    async def execute(self, requests: list[InferRequest]) -> list[InferResponse | ModelplexError]:
        call_id, future = self._open_call(asyncio.get_running_loop().create_future())
        self._send_execute(call_id, requests)
        try:
            header, buffers = await asyncio.wait_for(future, self.execute_timeout)
        except TimeoutError:
            raise self._hung() from None
        finally:
            self._calls.pop(call_id, None)
        responses = header["responses"]
        if len(responses) != len(requests):
            raise InternalError(f"model '{self.model_name}' returned {len(responses)} responses "
                                f"for {len(requests)} requests")
        results: list[InferResponse | ModelplexError] = []
        for desc in responses:  # a response carrying an error fails its own request only
            try:
                results.append(self._response(desc, buffers))
            except ModelplexError as e:
                results.append(e)
        return results

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        call_id, executed = None, False
        await self._execute_lock.acquire()
        try:
            call_id, replies = self._open_call(asyncio.Queue())
            self._send_execute(call_id, [request])
            while True:
                try:
                    item = await asyncio.wait_for(replies.get(), self.execute_timeout)
                except TimeoutError:
                    if not executed:
                        raise self._hung() from None
                    raise InternalError(f"model '{self.model_name}' sent no response (and no final flag) "
                                        f"within {self.execute_timeout:g} s") from None
                if isinstance(item, BaseException):
                    raise item
                header, buffers = item
                if header["op"] == "executed":
                    executed = True
                    self._execute_lock.release()
                    continue
                if header.get("error"):
                    raise InternalError(f"model '{self.model_name}': {header['error']}")
                if header.get("response") is not None:
                    yield self._response(header["response"], buffers)
                if header["final"]:
                    return
        finally:
            if not executed:
                self._execute_lock.release()
            self._calls.pop(call_id, None)

    async def close(self) -> None:
        self._loop = asyncio.get_running_loop()  # the worker's last frames may come before any call did
        worker = self.worker
        worker.closing = True
        if worker.proc.poll() is None:
            worker.send({"op": "finalize"})
            try:
                await asyncio.to_thread(worker.proc.wait, FINALIZE_TIMEOUT_SECS)
            except subprocess.TimeoutExpired:
                log.warning("python worker %s: finalize took over %.0f s; killed", self.title, FINALIZE_TIMEOUT_SECS)
        await asyncio.to_thread(worker.stop)
        worker.channel.close()

    # ---- calls ----------------------------------------------------------------------------
    def _open_call(self, waiter):
        # The loop first, the death check second: `_on_exit` (another thread) sets the reason
        # first and reads the loop second, so a call is either refused here or failed there.
        self._loop = asyncio.get_running_loop()
        if self._dead_reason is not None:
            raise InternalError(f"model '{self.model_name}': {self._dead_reason}")
        call_id = next(self._call_ids)
        self._calls[call_id] = waiter
        return call_id, waiter

    def _send_execute(self, call_id: int, requests: list[InferRequest]) -> None:
        # BLS calls the model makes while it executes run in this request's context (its trace and
        # request id); with several requests in flight on one instance, the latest one's.
        self._execute_context = contextvars.copy_context()
        buffers: list = []
        descs = [{"id": r.id, "inputs": [encode_tensor(t.name, t.data, buffers) for t in r.inputs],
                  "outputs": [o.name for o in r.outputs], "parameters": r.parameters} for r in requests]
        self.worker.send({"op": "execute", "id": call_id, "requests": descs}, buffers)

    def _hung(self) -> InternalError:
        reason = f"python worker for {self.title} did not finish execute within {self.execute_timeout:g} s"
        self.worker.kill(reason + " and was killed")
        return InternalError(f"model '{self.model_name}': {reason}")

    def _response(self, desc: dict, buffers: list) -> InferResponse:
        if desc.get("error"):
            error = ERRORS_BY_CODE.get(desc["error"]["code"], InternalError)
            raise error(f"model '{self.model_name}': {desc['error']['message']}")
        outputs = []
        for t in desc["outputs"]:
            declared = self._output_types.get(t["name"])
            if self._output_types and declared is None and t["name"] not in self._state_outputs:
                raise InternalError(f"model '{self.model_name}' returned output '{t['name']}', "
                                    "which its config does not declare")
            if declared is not None:
                self._check_output(t["name"], t["datatype"], t["shape"], declared)
            outputs.append(InferTensor(t["name"], t["datatype"], t["shape"], decode_tensor(t, buffers)))
        return InferResponse(self.model_name, "", outputs, parameters=desc.get("parameters") or {})

    def _check_output(self, name: str, datatype: str, shape: list[int], declared) -> None:
        """An output must be what the config declares (datatype, and shape: the batch dimension when
        max_batch_size > 0, then `dims` or its `reshape`, -1 matching any size): a client reading it as
        declared would misread the bytes, so a mismatch fails the request with a 500 naming the output."""
        if datatype != declared.datatype:
            raise InternalError(f"model '{self.model_name}' returned output '{name}' as {datatype}; its config "
                                f"declares {declared.datatype}")
        batched = self._max_batch_size > 0
        dims = tuple(shape[1:] if batched else shape)
        if not (batched and not shape) and any(_fits(dims, expected) for expected in (declared.dims, declared.reshape)
                                               if expected is not None):
            return
        expected = ([-1] if batched else []) + list(declared.dims)
        raise InternalError(f"model '{self.model_name}' returned output '{name}' of shape {list(shape)}; its config "
                            f"declares {expected}")

    # ---- from the worker's reader thread --------------------------------------------------
    def _on_message(self, header: dict, buffers: list) -> None:
        if self._loop is not None:  # else nothing was asked yet, so nothing waits for it
            self._loop.call_soon_threadsafe(self._deliver, header, buffers)

    def _deliver(self, header: dict, buffers: list) -> None:
        op = header["op"]
        if op in ("bls", "control"):
            serve = serve_bls if op == "bls" else serve_control
            task = self._loop.create_task(serve(self.dataplane, self.worker, header, buffers),
                                          context=self._execute_context)
            self._bls_tasks.add(task)
            task.add_done_callback(self._bls_tasks.discard)
            return
        waiter = self._calls.get(header.get("id"))
        if waiter is None:
            log.debug("python worker %s answered call %s, which is no longer waiting", self.title, header.get("id"))
        elif isinstance(waiter, asyncio.Queue):
            waiter.put_nowait(_error_of(self.model_name, header) if op == "error" else (header, buffers))
        elif not waiter.done():
            if op == "error":
                waiter.set_exception(_error_of(self.model_name, header))
            else:
                waiter.set_result((header, buffers))

    def _on_exit(self, reason: str) -> None:
        self._dead_reason = reason
        self._report_failure(reason)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._fail_calls, reason)

    def _fail_calls(self, reason: str) -> None:
        for waiter in self._calls.values():
            error = InternalError(f"model '{self.model_name}': {reason}")
            if isinstance(waiter, asyncio.Queue):
                waiter.put_nowait(error)
            elif not waiter.done():
                waiter.set_exception(error)


def _error_of(model_name: str, header: dict) -> InternalError:
    return InternalError(f"model '{model_name}' failed in execute: {header['message']}")


def _fits(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(d == e or e == -1 for d, e in zip(shape, dims))


def _output_datatypes(config):
    from modelplex import tensor_specs

    return tensor_specs(config.output).values()
