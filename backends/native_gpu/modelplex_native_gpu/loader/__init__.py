"""Weight, config and tokenizer loading from an HF folder or a GGUF file."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..errors import ModelLoadError
from ..models.config import ArchConfig


@dataclass
class LoadedWeights:
    """Architecture plus HF-named fp32/bf16 tensors, ready for the family model's load_weights."""

    config: ArchConfig
    # Tensors, or sources read when the model takes them: an HF folder's hf.SafetensorsTensor (`load()`),
    # a GGUF's quantized gguf_tensors.GGUFQuantizedTensor (`read_into`, kept in its blocks).
    weights: dict[str, torch.Tensor]

    @property
    def is_quantized(self) -> bool:
        return any(hasattr(w, "read_into") for w in self.weights.values())

    def dequantized(self) -> LoadedWeights:
        """The same weights with every quantized tensor dequantized to fp32 (quantized_weights off, or no kernel for
        the device: a CPU without a compiler, CUDA without Triton)."""
        return LoadedWeights(self.config, {k: w.dequantize() if hasattr(w, "read_into") else w
                                           for k, w in self.weights.items()})


def load_weights(model_path: str) -> LoadedWeights:
    """`model_path` is a .gguf file, a folder holding exactly one .gguf, or an HF folder (config.json)."""
    from . import gguf as gguf_loader
    from . import hf as hf_loader

    gguf_file = find_gguf(model_path)
    if gguf_file:
        return gguf_loader.load(gguf_file)
    if os.path.isfile(os.path.join(model_path, "config.json")):
        return hf_loader.load(model_path)
    raise ModelLoadError(f"{model_path!r} is neither a GGUF file nor a folder with config.json")


def find_gguf(model_path: str) -> str | None:
    if model_path.endswith(".gguf") and os.path.isfile(model_path):
        return model_path
    if os.path.isdir(model_path) and not os.path.isfile(os.path.join(model_path, "config.json")):
        found = sorted(f for f in os.listdir(model_path) if f.endswith(".gguf"))
        if len(found) == 1:
            return os.path.join(model_path, found[0])
        if found:
            raise ModelLoadError(f"{model_path!r} holds several .gguf files: {found}")
    return None
