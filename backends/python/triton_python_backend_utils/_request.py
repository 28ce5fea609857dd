"""Requests a model receives, the response sender of decoupled models, and BLS calls to other models."""
from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator

from ._types import InferenceResponse, Tensor, TritonModelException

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class _Runtime:
    """Where BLS calls go: the worker process installs itself here when it starts."""

    bls: Callable[[InferenceRequest, bool], object] | None = None
    control: Callable[[str, dict, dict | None], object] | None = None


runtime = _Runtime()


def _control(action: str, arguments: dict, files: dict | None = None):
    if runtime.control is None:
        raise TritonModelException("model control works in execute, not in initialize nor outside a model "
                                   "served by modelplex")
    return runtime.control(action, arguments, files)


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model, optionally with a config (JSON) and files such as {"1/model.py": b"..."};
    the server must run with --model-control-mode explicit, as Triton's."""
    _control("load", {"model_name": model_name, "config": config or None},
             {path.removeprefix("file:"): bytes(content) for path, content in (files or {}).items()})


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _control("unload", {"model_name": model_name, "unload_dependents": unload_dependents})


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return bool(_control("ready", {"model_name": model_name, "model_version": model_version}))


class InferenceResponseSender:
    """Sends the responses of one request of a decoupled model, from any thread; the last send
    carries `TRITONSERVER_RESPONSE_COMPLETE_FINAL`."""

    def __init__(self, deliver: Callable[[InferenceResponse | None, bool], None]):
        self._deliver = deliver
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self._lock:
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if response is None and not final:
                raise TritonModelException("send() needs a response unless flags is "
                                           "TRITONSERVER_RESPONSE_COMPLETE_FINAL")
            self._closed = final
            self._deliver(response, final)

    def is_cancelled(self) -> bool:
        return False


class InferenceRequest:
    """A request: one `execute` receives (with a response sender if the model is decoupled), or
    one a model builds to call another model (BLS) with `exec()` / `async_exec()`."""

    def __init__(self, request_id: str = "", correlation_id: int | str = 0, inputs=(),
                 requested_output_names=(), model_name: str = "", model_version: int = -1, flags: int = 0,
                 timeout: int = 0, preferred_memory=None, trace=None, parameters: dict | None = None):
        for tensor in inputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(f"InferenceRequest inputs must be pb_utils.Tensor, "
                                           f"got {type(tensor).__name__}")
        self._id, self._correlation_id = _text(request_id), correlation_id
        self._inputs = list(inputs)
        self._requested_output_names = [_text(n) for n in requested_output_names]
        self.model_name, self.model_version = _text(model_name), int(model_version)
        self._flags, self._timeout = flags, timeout
        self._parameters = dict(parameters or {})
        self._sender: InferenceResponseSender | None = None
        self._sender_taken = False  # a model that is not decoupled answers through it if it took it

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The request parameters as a JSON string (as Triton returns them)."""
        return json.dumps(self._parameters)

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def is_cancelled(self) -> bool:
        return False

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException("get_response_sender() is only available to requests a model receives")
        self._sender_taken = True
        return self._sender

    def exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """Run this request on `model_name` through the server; errors come back in the response.
        With `decoupled=True`, an iterator over the model's responses."""
        if not self.model_name:
            raise TritonModelException("a BLS InferenceRequest needs model_name")
        if runtime.bls is None:
            raise TritonModelException("BLS calls work in execute, not in initialize nor outside a model served "
                                       "by modelplex")
        return runtime.bls(self, decoupled)

    def async_exec(self, decoupled: bool = False):
        """`exec` as an awaitable, so an `async def execute` can run several BLS calls at once."""
        return asyncio.get_running_loop().run_in_executor(None, self.exec, decoupled)


def _text(value) -> str:
    """Names as str; bytes too (Triton's own BLS example passes a BYTES tensor element as model_name)."""
    return value.decode() if isinstance(value, bytes) else str(value)
