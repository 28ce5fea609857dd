"""HF folder loading: config.json plus *.safetensors (sharded or not), each tensor left in its file until the
model takes it."""
from __future__ import annotations

import glob
import json
import os

import torch

from ..errors import ModelLoadError
from ..models.config import ArchConfig
from . import LoadedWeights


class SafetensorsTensor:
    """One checkpoint tensor, read by `load` when the model copies it into its parameter. The file is mapped
    only while that tensor lives, so the checkpoint's pages never pile up beside the model: a bf16 file
    loads at bf16 with peak RSS near the final one (no whole-checkpoint or fp32 copy)."""

    __slots__ = ("path", "name")

    def __init__(self, path: str, name: str):
        self.path, self.name = path, name

    def load(self) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(self.path, framework="pt") as f:
            return f.get_tensor(self.name)  # a view of the file's mapping, unmapped when the tensor is freed


def load(folder: str) -> LoadedWeights:
    from safetensors import safe_open

    with open(os.path.join(folder, "config.json")) as f:
        config = ArchConfig.from_hf(json.load(f))
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ModelLoadError(f"no .safetensors files in {folder!r}")
    weights = {}
    for path in files:
        try:
            with safe_open(path, framework="pt") as f:
                names = list(f.keys())
        except Exception as e:  # safetensors raises its own SafetensorError on a bad header
            raise ModelLoadError(f"{path!r} is not a readable safetensors file: {e}") from e
        weights.update((name, SafetensorsTensor(path, name)) for name in names)
    return LoadedWeights(config, weights)
