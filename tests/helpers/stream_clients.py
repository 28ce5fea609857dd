"""A client of the Python backend's decoupled `repeat_int32` model (one gRPC stream per call), shared
by the tests that need streams running."""
from __future__ import annotations

import queue
import threading

import numpy as np
import tritonclient.grpc as grpcclient


def repeat_stream(url: str, values: list[int], delay_ms: int, started: threading.Semaphore | None = None) -> list:
    """One gRPC stream of `repeat_int32`: the OUT values received, then "FINAL" (or the error);
    `started` is released when the first response arrives."""
    client = grpcclient.InferenceServerClient(url)
    received: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put((result, error)))
    arrays = {"IN": np.array(values, np.int32), "DELAY": np.full(len(values), delay_ms, np.uint32),
              "WAIT": np.array([0], np.uint32)}
    inputs = []
    for name, array in arrays.items():
        inputs.append(grpcclient.InferInput(name, list(array.shape), "INT32" if name == "IN" else "UINT32"))
        inputs[-1].set_data_from_numpy(array)
    client.async_stream_infer("repeat_int32", inputs, enable_empty_final_response=True)
    out = []
    try:
        while True:
            result, error = received.get(timeout=30)
            if error is not None:
                return out + [str(error)]
            if result.get_response().parameters["triton_final_response"].bool_param:
                return out + ["FINAL"]
            out.append(int(result.as_numpy("OUT")[0]))
            if started is not None and len(out) == 1:
                started.release()
    finally:
        client.stop_stream()
        client.close()
