"""Random-weight Llama-family models made on the spot with a fixed seed, as transformers models and as the
engine's LoadedWeights over the same tensors (nothing is written to disk)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from modelplex_native_gpu.loader import LoadedWeights
from modelplex_native_gpu.models.config import ArchConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Shape:
    """The numbers of one config.json; `arch` is LlamaForCausalLM or Qwen2ForCausalLM."""

    name: str
    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool = False
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None

    def config_dict(self, max_positions: int = 4096) -> dict:
        return {"architectures": [self.arch], "model_type": "qwen2" if self.arch.startswith("Qwen2") else "llama",
                "hidden_size": self.hidden, "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "intermediate_size": self.ffn, "vocab_size": self.vocab,
                "tie_word_embeddings": self.tied, "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling,
                "max_position_embeddings": max_positions, "rms_norm_eps": 1e-5, "bos_token_id": 0,
                "eos_token_id": 1, "hidden_act": "silu", "initializer_range": 0.02}


LLAMA_3_2_1B = Shape("llama-3.2-1b-shaped", "LlamaForCausalLM", 2048, 16, 32, 8, 8192, 128256, tied=True,
                     rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                        "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 8192})


def hf_config(shape: Shape, max_positions: int = 4096):
    from transformers import AutoConfig

    values = shape.config_dict(max_positions)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def make_hf_model(shape: Shape, dtype: str, device: str, seed: int = 0, max_positions: int = 4096):
    """transformers' model with its own random init under `seed`, built directly on `device` in `dtype`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(shape, max_positions), dtype=DTYPES[dtype])
    return model.eval()


def loaded_weights(hf_model, shape: Shape, max_positions: int = 4096) -> LoadedWeights:
    """The engine's view of the same weights: HF names, the transformers model's own tensors."""
    return LoadedWeights(ArchConfig.from_hf(shape.config_dict(max_positions)), dict(hf_model.state_dict()))


def random_prompts(lengths: list[int], vocab: int, seed: int = 1, prefix: int = 0) -> list[list[int]]:
    """Token-id prompts (ids from 2: 0 and 1 are bos/eos); the first `prefix` tokens shared by all."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(2, vocab, (prefix,), generator=g).tolist()
    return [shared + torch.randint(2, vocab, (n,), generator=g).tolist() for n in lengths]


def make_engine(loaded: LoadedWeights, device: str, dtype: str, **config):
    """An engine over `loaded` taking token ids (no tokenizer); keyword arguments are EngineConfig fields."""
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    settings = dict(device=device, dtype=dtype, skip_tokenizer_init=True, seed=0)
    settings.update(config)
    return LLMEngine(EngineConfig(**settings), loaded=loaded)
