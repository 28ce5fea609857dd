"""HF folder loading: config.json plus *.safetensors (sharded or not)."""
from __future__ import annotations

import glob
import json
import os

from ..errors import ModelLoadError
from ..models.config import ArchConfig
from . import LoadedWeights


def load(folder: str) -> LoadedWeights:
    from safetensors.torch import load_file

    with open(os.path.join(folder, "config.json")) as f:
        config = ArchConfig.from_hf(json.load(f))
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ModelLoadError(f"no .safetensors files in {folder!r}")
    weights = {}
    for path in files:
        weights.update(load_file(path))
    return LoadedWeights(config, weights)
