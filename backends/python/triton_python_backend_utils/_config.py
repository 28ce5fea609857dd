"""Reading a model config (Triton's JSON as a dict) and the `ModelConfig` that auto_complete_config edits."""
from __future__ import annotations

import json

import numpy as np

TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
_CODE_TO_NUMPY = [None, bool, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64,
                  np.float16, np.float32, np.float64, np.object_]


def triton_string_to_numpy(triton_type_string: str):
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int):
    return _CODE_TO_NUMPY[data_type] if 0 < data_type < len(_CODE_TO_NUMPY) else None


def numpy_to_triton_type(data_type) -> int | None:
    for code, np_type in enumerate(_CODE_TO_NUMPY):
        if np_type is not None and np.dtype(np_type) == np.dtype(data_type):
            return code
    return 13 if np.dtype(data_type).kind in "SU" else None


def _by_name(tensors: list[dict], name: str) -> dict | None:
    return next((t for t in tensors if t.get("name") == name), None)


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    return _by_name(model_config.get("input", []), name)


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    return _by_name(model_config.get("output", []), name)


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


class ModelConfig:
    """The config given to `TritonPythonModel.auto_complete_config`: only max_batch_size, the
    scheduler, inputs, outputs and the transaction policy may change; conflicts raise ValueError."""

    def __init__(self, model_config: str | dict):
        self._model_config = json.loads(model_config) if isinstance(model_config, str) else model_config

    def as_dict(self) -> dict:
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = self._model_config.get("max_batch_size", 0)
        if configured > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {configured}, but auto_complete_config "
                             f"of model '{self._model_config.get('name')}' set {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(f"model '{self._model_config.get('name')}' already uses {other}")
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict) -> None:
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, transaction_policy_dict: dict) -> None:
        if set(transaction_policy_dict) - {"decoupled"}:
            raise ValueError("model_transaction_policy only has 'decoupled'")
        self._model_config["model_transaction_policy"] = dict(transaction_policy_dict)

    def _add(self, kind: str, tensor: dict, allowed: tuple[str, ...]) -> None:
        model = self._model_config.get("name")
        extra = set(tensor) - set(allowed)
        if extra:
            raise ValueError(f"{kind} '{tensor.get('name')}' of model '{model}' has unknown properties {sorted(extra)}")
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{kind} of model '{model}' is missing '{key}'")
        tensors = self._model_config.setdefault(kind, [])
        existing = _by_name(tensors, tensor["name"])
        if existing is None:
            tensors.append(dict(tensor))
            return
        for key in ("data_type", "dims"):
            if key in existing and existing[key] and list(np.atleast_1d(existing[key])) != list(
                    np.atleast_1d(tensor[key])):
                raise ValueError(f"{kind} '{tensor['name']}' of model '{model}' already has {key} "
                                 f"{existing[key]}, auto_complete_config gave {tensor[key]}")
        existing.update(tensor)
