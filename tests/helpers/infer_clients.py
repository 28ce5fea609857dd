"""Inference through Triton's own HTTP and gRPC clients, so a test can ask both doors the same thing."""
from __future__ import annotations

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

PROTOCOLS = ("http", "grpc")


def client(server, protocol: str):
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def infer(server, protocol: str, model: str, inputs: dict[str, np.ndarray], outputs: list[str] | None = None):
    """The client's `InferResult` (`.as_numpy(name)`; None for an output that was not returned)."""
    module = httpclient if protocol == "http" else grpcclient
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    requested = [module.InferRequestedOutput(name) for name in outputs] if outputs else None
    return client(server, protocol).infer(model, tensors, outputs=requested)


def model_config(server, protocol: str, model: str) -> dict:
    """The model's config as Triton's JSON (gRPC's protobuf answer converted the same way)."""
    if protocol == "http":
        return client(server, protocol).get_model_config(model)
    return client(server, protocol).get_model_config(model, as_json=True)["config"]


def repository_index(server) -> dict[str, dict]:
    return {row["name"]: row for row in client(server, "http").get_model_repository_index()}
