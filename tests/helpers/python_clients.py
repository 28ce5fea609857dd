"""Helpers shared by the Python-backend tests: server arguments and small tritonclient calls."""
from __future__ import annotations

import queue

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

# Only the backends these tests use: a plugin being worked on elsewhere cannot break them.
SERVER_ENV = {"MODELPLEX_PLUGINS": "onnx,python,ensemble"}


def load_args(models: list[str]) -> list[str]:
    args = ["--model-control-mode", "explicit"]
    for model in models:
        args += ["--load-model", model]
    return args


DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32", np.dtype(np.uint32): "UINT32",
             np.dtype(np.int64): "INT64", np.dtype(np.object_): "BYTES"}


def inputs(module, **arrays: np.ndarray) -> list:
    """`module.InferInput`s (module: tritonclient.http or .grpc) holding `arrays` by name."""
    result = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), DATATYPES[array.dtype])
        tensor.set_data_from_numpy(array)
        result.append(tensor)
    return result


def text(*values: str) -> np.ndarray:
    return np.array([v.encode() for v in values], dtype=np.object_)


def http_infer(server, model: str, **arrays: np.ndarray):
    client = httpclient.InferenceServerClient(server.http_url)
    return client.infer(model, inputs(httpclient, **arrays))


def stream(server, model: str, requests: list[dict], timeout: float = 30, order: list | None = None) -> dict[str, list]:
    """Send each request (arrays by input name) on one gRPC stream; returns, per request id, the
    responses in order (`InferResult`, or the error text), the empty final response as "FINAL".
    `order`, if given, gets the request id of every response as it arrives."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    received: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put((result, error)))
    by_id: dict[str, list] = {str(i): [] for i in range(len(requests))}
    try:
        for i, arrays in enumerate(requests):
            client.async_stream_infer(model, inputs(grpcclient, **arrays), request_id=str(i),
                                      enable_empty_final_response=True)
        open_ids = set(by_id)
        while open_ids:
            result, error = received.get(timeout=timeout)
            if error is not None:  # in-band errors carry no request id: only one request may fail
                assert len(open_ids) == 1, f"error {error} while {open_ids} were open"
                by_id[open_ids.pop()].append(str(error))
                continue
            response = result.get_response()
            if order is not None:
                order.append(response.id)
            if response.parameters["triton_final_response"].bool_param:
                by_id[response.id].append("FINAL")
                open_ids.discard(response.id)
            else:
                by_id[response.id].append(result)
    finally:
        client.stop_stream()
        client.close()
    return by_id
