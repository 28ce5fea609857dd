"""Helpers shared by the LLM serving tests (a module of its own: conftest names clash across folders)."""
import json
import time

import httpx
import numpy as np

MODEL = "smollm2"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def engine_stats(base_url: str) -> dict:
    (stats,) = httpx.get(f"{base_url}/v2/models/{MODEL}/engine_stats").json()["instances"]
    return stats


def wait_for_stats(base_url: str, timeout: float = 10, **expected) -> dict:
    """Poll engine_stats until every `expected` key has its value; fail with the last stats otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        stats = engine_stats(base_url)
        if all(stats[k] == v for k, v in expected.items()) or time.monotonic() > deadline:
            assert {k: stats[k] for k in expected} == expected, stats
            return stats
        time.sleep(0.05)


def grpc_inputs(prompt: str, sampling: dict):
    import tritonclient.grpc as grpcclient

    inputs = [grpcclient.InferInput("text_input", [1], "BYTES"),
              grpcclient.InferInput("sampling_parameters", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=np.object_))
    return inputs
