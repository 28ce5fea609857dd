"""The process one Python model instance runs in: loads `model.py`, runs `TritonPythonModel`, answers the server.

Started as `python -m modelplex_python.worker <socket fd>`. The main thread runs `initialize`, each
`execute` (one at a time, as Triton does) and `finalize`; a reader thread takes frames off the socket
and routes BLS answers to the threads waiting for them. A crash here ends only this process.
"""
from __future__ import annotations

import asyncio
import importlib.util
import inspect
import itertools
import json
import os
import queue
import socket
import sys
import threading
import traceback
from pathlib import Path

import triton_python_backend_utils as pb_utils
from triton_python_backend_utils._request import InferenceResponseSender, runtime

from .protocol import Channel, ChannelClosed, decode_tensor, encode_tensor


def load_model_class(model_file: str):
    """`TritonPythonModel` from model.py; its folder goes on sys.path so it can import its neighbours."""
    path = Path(model_file)
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    try:
        return module.TritonPythonModel
    except AttributeError:
        raise pb_utils.TritonModelException(f"{path} defines no class TritonPythonModel") from None


def describe(error: BaseException) -> str:
    """What the client sees of an exception from model code: Triton's own exceptions by message only."""
    if isinstance(error, pb_utils.TritonModelException):
        return str(error)
    return f"{type(error).__name__}: {error}"


# ---- pb_utils objects <-> frames -------------------------------------------------------------
def encode_response(response, buffers: list) -> dict:
    if not isinstance(response, pb_utils.InferenceResponse):
        raise pb_utils.TritonModelException(
            f"expected a pb_utils.InferenceResponse, got {type(response).__name__}")
    if response.has_error():
        error = response.error()
        return {"error": {"message": error.message(), "code": error.code()}}
    outputs = []
    for tensor in response.output_tensors():
        if not isinstance(tensor, pb_utils.Tensor):
            raise pb_utils.TritonModelException(
                f"output_tensors must hold pb_utils.Tensor objects, got {type(tensor).__name__}")
        outputs.append(encode_tensor(tensor.name(), tensor.as_numpy(), buffers))
    return {"outputs": outputs, "parameters": response._parameters}


def decode_response(desc: dict, buffers: list) -> pb_utils.InferenceResponse:
    if desc.get("error"):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(desc["error"]["message"], desc["error"]["code"]))
    outputs = [pb_utils.Tensor(t["name"], decode_tensor(t, buffers)) for t in desc["outputs"]]
    return pb_utils.InferenceResponse(outputs, parameters=desc.get("parameters"))


def encode_request(request: pb_utils.InferenceRequest, buffers: list) -> dict:
    return {"model_name": request.model_name, "model_version": request.model_version,
            "id": request.request_id(), "inputs": [encode_tensor(t.name(), t.as_numpy(), buffers)
                                                   for t in request.inputs()],
            "outputs": request.requested_output_names(), "parameters": request._parameters}


def _sequence_flags(parameters: dict) -> int:
    """Triton's request flags from the sequence parameters (the host has checked them)."""
    return ((pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if parameters.get("sequence_start") else 0)
            | (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if parameters.get("sequence_end") else 0))


class Worker:
    def __init__(self, channel: Channel):
        self.channel = channel
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()  # execute / finalize, for the main thread
        self.model = None
        self.decoupled = False
        self._replies: dict[int, queue.SimpleQueue] = {}  # calls to the server (BLS, model control) by id
        self._server_call_ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None  # for `async def execute`, made on first use

    def run(self) -> None:
        header, _ = self.channel.receive()
        try:
            model_class = load_model_class(header["model_file"])
            if header["op"] == "auto_complete":
                self.channel.send({"op": "config", "config": self._auto_complete(model_class, header["config"])})
                return
            self.decoupled = header["decoupled"]
            # Reading from here on: a server that goes away while `initialize` hangs ends this process
            # (nothing else arrives before "ready"; the reader ends the process when the channel closes).
            threading.Thread(target=self._read, name="modelplex-reader", daemon=True).start()
            self.model = model_class()
            if hasattr(self.model, "initialize"):
                self.model.initialize(header["args"])
            # Only now: the server answers a worker's calls once it is serving it, not while it loads.
            runtime.bls, runtime.control = self.bls, self.control
        except Exception as e:
            traceback.print_exc()
            self.channel.send({"op": "init_error", "message": describe(e)})
            return
        self.channel.send({"op": "ready"})
        while True:
            header, buffers = self.inbox.get()
            if header["op"] == "finalize":
                self._finalize()
                return
            self._execute(header, buffers)

    def _auto_complete(self, model_class, config_json: str) -> str:
        config = pb_utils.ModelConfig(config_json)
        if hasattr(model_class, "auto_complete_config"):
            config = model_class.auto_complete_config(config)
            if not isinstance(config, pb_utils.ModelConfig):
                raise pb_utils.TritonModelException("auto_complete_config must return the pb_utils.ModelConfig")
        return json.dumps(config.as_dict())

    def _read(self) -> None:
        try:
            while True:
                header, buffers = self.channel.receive()
                if header["op"] in ("bls_response", "control_response"):
                    replies = self._replies.get(header["id"])
                    if replies is not None:
                        replies.put((header, buffers))
                else:
                    self.inbox.put((header, buffers))
        except ChannelClosed:
            os._exit(0)  # the server is gone: nobody is left to answer

    # ---- execute --------------------------------------------------------------------------
    def _execute(self, header: dict, buffers: list) -> None:
        call_id = header["id"]
        sent = None if self.decoupled else _SentResponses(self, call_id, len(header["requests"]))
        requests = [self._request(call_id, index, desc, buffers, sent)
                    for index, desc in enumerate(header["requests"])]
        try:
            result = self.model.execute(requests)
            if inspect.isawaitable(result):
                if self._loop is None:
                    self._loop = asyncio.new_event_loop()
                result = self._loop.run_until_complete(result)
            if self.decoupled:
                if result is not None:
                    raise pb_utils.TritonModelException("a decoupled model's execute must return None and send "
                                                        "its responses with request.get_response_sender()")
                self.channel.send({"op": "executed", "id": call_id})
                return
            if result is None and any(r._sender_taken for r in requests):
                return  # the responses come through the senders (see _SentResponses)
            self._answer(call_id, result, len(requests))
        except Exception as e:
            self._fail(call_id, e)

    def _answer(self, call_id: int, result, num_requests: int) -> None:
        if not isinstance(result, (list, tuple)) or len(result) != num_requests:
            got = f"{len(result)} responses" if isinstance(result, (list, tuple)) else type(result).__name__
            raise pb_utils.TritonModelException(f"execute returned {got} for {num_requests} request(s)")
        out_buffers: list = []
        responses = [encode_response(r, out_buffers) for r in result]
        self.channel.send({"op": "responses", "id": call_id, "responses": responses}, out_buffers)

    def _fail(self, call_id: int, error: Exception) -> None:
        traceback.print_exc()  # the whole traceback for the server log; the client gets its last line
        self.channel.send({"op": "error", "id": call_id, "message": describe(error)})

    def _request(self, call_id: int, index: int, desc: dict, buffers: list,
                 sent: _SentResponses | None) -> pb_utils.InferenceRequest:
        inputs = [pb_utils.Tensor(t["name"], decode_tensor(t, buffers)) for t in desc["inputs"]]
        parameters = desc["parameters"]
        request = pb_utils.InferenceRequest(request_id=desc["id"], inputs=inputs,
                                            requested_output_names=desc["outputs"], parameters=parameters,
                                            correlation_id=parameters.get("sequence_id", 0),
                                            flags=_sequence_flags(parameters))
        if self.decoupled:
            request._sender = InferenceResponseSender(lambda response, final: self._stream(call_id, index,
                                                                                           response, final))
        else:
            request._sender = InferenceResponseSender(lambda response, final: sent.deliver(index, response, final))
        return request

    def _stream(self, call_id: int, index: int, response, final: bool) -> None:
        """One response of a decoupled model, from whichever thread the model sends it."""
        header = {"op": "send", "id": call_id, "index": index, "final": final}
        buffers: list = []
        try:
            header["response"] = None if response is None else encode_response(response, buffers)
        except pb_utils.TritonModelException as e:
            self.channel.send(header | {"error": str(e), "final": True})
            raise
        self.channel.send(header, buffers)

    def _finalize(self) -> None:
        try:
            if hasattr(self.model, "finalize"):
                self.model.finalize()
        except Exception:
            traceback.print_exc()
        self.channel.send({"op": "finalized"})

    # ---- BLS: calls to other models through the server ----------------------------------------
    def bls(self, request: pb_utils.InferenceRequest, decoupled: bool):
        call_id = next(self._server_call_ids)
        replies: queue.SimpleQueue = queue.SimpleQueue()
        self._replies[call_id] = replies
        buffers: list = []
        try:
            self.channel.send({"op": "bls", "id": call_id, "decoupled": decoupled,
                               "request": encode_request(request, buffers)}, buffers)
        except BaseException:
            del self._replies[call_id]
            raise
        if decoupled:
            return self._bls_responses(call_id, replies)
        try:
            header, buffers = replies.get()
            return decode_response(header["response"], buffers)
        finally:
            del self._replies[call_id]

    def control(self, action: str, arguments: dict, files: dict[str, bytes] | None = None):
        """Model control (load, unload, is_model_ready) through the server; its answer, or its error raised."""
        call_id = next(self._server_call_ids)
        replies: queue.SimpleQueue = queue.SimpleQueue()
        self._replies[call_id] = replies
        buffers = list((files or {}).values())
        try:
            self.channel.send({"op": "control", "id": call_id, "action": action, "arguments": arguments,
                               "files": list(files or {})}, buffers)
            header, _ = replies.get()
        finally:
            del self._replies[call_id]
        if "error" in header:
            raise pb_utils.TritonModelException(header["error"])
        return header.get("result")

    def _bls_responses(self, call_id: int, replies: queue.SimpleQueue):
        try:
            while True:
                header, buffers = replies.get()
                if header.get("response") is not None:
                    yield decode_response(header["response"], buffers)
                if header["final"]:
                    return
        finally:
            del self._replies[call_id]


class _SentResponses:
    """Responses a model that is not decoupled sends through response senders instead of returning them
    (Triton allows it when execute returns None): exactly one per request, then the final flag; they
    go to the server as one answer once every request has had its final flag."""

    def __init__(self, worker: Worker, call_id: int, num_requests: int):
        self.worker, self.call_id = worker, call_id
        self.responses: list = [None] * num_requests
        self.num_open = num_requests
        self._lock = threading.Lock()

    def deliver(self, index: int, response, final: bool) -> None:
        with self._lock:
            if response is not None and self.responses[index] is not None:
                raise pb_utils.TritonModelException("a model that is not decoupled sends one response per request")
            if response is not None:
                self.responses[index] = response
            if final and self.responses[index] is None:
                self.responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "the model sent the final flag without a response"))
            self.num_open -= final
            complete = self.num_open == 0
        if complete:
            try:
                self.worker._answer(self.call_id, self.responses, len(self.responses))
            except pb_utils.TritonModelException as e:
                self.worker._fail(self.call_id, e)
                raise


def main() -> None:
    channel = Channel(socket.socket(fileno=int(sys.argv[1])))
    Worker(channel).run()
    channel.close()


if __name__ == "__main__":
    main()
