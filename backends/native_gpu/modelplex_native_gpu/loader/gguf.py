"""GGUF loading: architecture from metadata, tensors renamed to HF names: float ones as fp32, quantized ones
left in the file as lazy sources (loader/gguf_tensors.py) that the model reads in their blocks.

Tensor names are llama.cpp's (gguf-py's tensor_mapping); the family-specific metadata is read in
gguf_config.py. Undone here: llama.cpp's RoPE row permutation of Llama/Mistral q/k (on the quantized
bytes too: whole rows of blocks), and the +1 its converter adds to Gemma's norm weights (the models add it
back, as for HF checkpoints).
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import ModelLoadError
from ..models.config import ArchConfig
from . import LoadedWeights, gguf_tensors
from .gguf_config import ARCHITECTURES, arch_config

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GEMMA_NAMES = {"ffn_norm.weight": "pre_feedforward_layernorm.weight",
                "post_attention_norm.weight": "post_attention_layernorm.weight",
                "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}
_FAMILY_NAMES = {"gemma2": _GEMMA_NAMES, "gemma3": _GEMMA_NAMES,
                 "phi3": {"ffn_up.weight": "mlp.gate_up_proj.weight"}}  # Phi-3's ffn_up holds gate and up
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_PERMUTED_ARCHITECTURES = ("llama", "mistral")  # llama.cpp's converter permutes q/k rows only for these


def _hf_name(name: str, family: str) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    parts = name.split(".", 2)
    if parts[0] != "blk" or len(parts) < 3:
        return None
    local = _FAMILY_NAMES.get(family, {}).get(parts[2]) or _LAYER_NAMES.get(parts[2])
    return None if local is None else f"model.layers.{parts[1]}.{local}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's RoPE row permutation of attn_q/attn_k (interleaved -> HF's half split)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load(path: str) -> LoadedWeights:
    import gguf

    reader = gguf_tensors.open_reader(path)
    gguf_tensors.check_tensors(reader, path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(f"general.architecture: unsupported GGUF architecture {arch!r}; "
                             f"supported: {tuple(ARCHITECTURES)}")
    tensors = {t.name: t for t in reader.tensors}

    def read(name: str) -> np.ndarray:
        tensor = tensors[name]
        w = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        return w.reshape([int(d) for d in reversed(tensor.shape)])

    config = arch_config(meta, arch, reader, read)
    weights = {}
    for name in tensors:
        hf_name = _hf_name(name, config.family)
        if hf_name is None:
            continue
        tensor = tensors[name]
        if gguf_tensors.is_quantized(tensor) and not hf_name.endswith(("norm.weight", ".bias")):
            weights[hf_name] = _quantized_to_hf(gguf_tensors.GGUFQuantizedTensor(path, tensor), name, arch, config)
            continue
        w = _to_hf(read(name), name, hf_name, arch, config)
        weights[hf_name] = torch.from_numpy(np.array(w, dtype=np.float32))  # copy: F32 tensors are read-only mmaps
    return LoadedWeights(config, weights)


def _to_hf(w: np.ndarray, name: str, hf_name: str, arch: str, config: ArchConfig) -> np.ndarray:
    if arch in _PERMUTED_ARCHITECTURES and name.endswith(("attn_q.weight", "attn_q.bias")):
        return _unpermute(w, config.num_attention_heads)
    if arch in _PERMUTED_ARCHITECTURES and name.endswith(("attn_k.weight", "attn_k.bias")):
        return _unpermute(w, config.num_key_value_heads)
    if config.family in ("gemma2", "gemma3") and hf_name.endswith("norm.weight"):
        return w - 1.0
    return w


def _quantized_to_hf(w: gguf_tensors.GGUFQuantizedTensor, name: str, arch: str,
                     config: ArchConfig) -> gguf_tensors.GGUFQuantizedTensor:
    """A quantized weight left in the file, llama.cpp's q/k row permutation undone on its rows."""
    if arch in _PERMUTED_ARCHITECTURES and name.endswith("attn_q.weight"):
        return w.unpermuted(config.num_attention_heads)
    if arch in _PERMUTED_ARCHITECTURES and name.endswith("attn_k.weight"):
        return w.unpermuted(config.num_key_value_heads)
    return w
