"""Model families: one file each, sharing Llama's layers; `model_class` picks one for an ArchConfig."""
from __future__ import annotations


def model_class(family: str):
    """The nn.Module class of a family ("llama", "qwen3", "gemma2", "gemma3", "phi3")."""
    if family == "qwen3":
        from .qwen3 import Qwen3ForCausalLM as cls
    elif family == "gemma2":
        from .gemma2 import Gemma2ForCausalLM as cls
    elif family == "gemma3":
        from .gemma3 import Gemma3ForCausalLM as cls
    elif family == "phi3":
        from .phi3 import Phi3ForCausalLM as cls
    else:
        from .llama import LlamaForCausalLM as cls
    return cls
