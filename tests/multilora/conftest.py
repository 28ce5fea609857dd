"""Fixtures of the multi-LoRA tests: the engine importable from a source checkout, SmolLM2 (the GGUF
wheel) for the engine and for transformers + PEFT, and LoRA adapters that PEFT itself creates."""
import os

import pytest
from helpers.lora import ADAPTERS, make_adapter

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def hf_model(gguf_path):
    import torch
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(gguf_path)
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def adapter_dirs(hf_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_adapters")
    return {name: make_adapter(hf_model, root / name, seed, **config)
            for seed, (name, config) in enumerate(ADAPTERS.items())}
