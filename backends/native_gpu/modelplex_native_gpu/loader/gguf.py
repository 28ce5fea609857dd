"""GGUF loading: architecture from metadata, tensors renamed to HF names: float ones as fp32, quantized ones
left in the file as lazy sources (loader/gguf_tensors.py) that the model reads in their blocks."""
from __future__ import annotations

import numpy as np
import torch

from ..errors import ModelLoadError
from ..models.config import LlamaArchConfig
from . import LoadedWeights, gguf_tensors

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_ARCHITECTURES = ("llama", "mistral", "qwen2")


def _hf_name(name: str) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    parts = name.split(".", 2)
    if parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


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
    if arch not in _ARCHITECTURES:
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; supported: {_ARCHITECTURES}")
    names = {t.name for t in reader.tensors}
    config = _config(meta, arch, reader, names)
    weights = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None:
            continue
        if gguf_tensors.is_quantized(tensor):
            w = gguf_tensors.GGUFQuantizedTensor(path, tensor)
            if arch != "qwen2" and tensor.name.endswith("attn_q.weight"):
                w = w.unpermuted(config.num_attention_heads)
            elif arch != "qwen2" and tensor.name.endswith("attn_k.weight"):
                w = w.unpermuted(config.num_key_value_heads)
            weights[name] = w
            continue
        w = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        w = w.reshape([int(d) for d in reversed(tensor.shape)])
        if arch != "qwen2" and tensor.name.endswith(("attn_q.weight", "attn_q.bias")):
            w = _unpermute(w, config.num_attention_heads)
        elif arch != "qwen2" and tensor.name.endswith(("attn_k.weight", "attn_k.bias")):
            w = _unpermute(w, config.num_key_value_heads)
        weights[name] = torch.from_numpy(np.array(w, dtype=np.float32))  # copy: F32 tensors are read-only mmaps
    return LoadedWeights(config, weights)


def _config(meta: dict, arch: str, reader, names: set[str]) -> LlamaArchConfig:
    def get(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    scaling = None
    if get("rope.scaling.type") in ("linear",):
        scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}

    def token_id(key):
        field = reader.fields.get(f"tokenizer.ggml.{key}")
        return int(field.contents()) if field is not None else None

    return LlamaArchConfig(
        vocab_size=int(embd.shape[1]), hidden_size=hidden, intermediate_size=int(get("feed_forward_length")),
        num_hidden_layers=int(get("block_count")), num_attention_heads=heads,
        num_key_value_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", hidden // heads)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        max_position_embeddings=int(get("context_length", 4096)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names, rope_scaling=scaling,
        bos_token_id=token_id("bos_token_id"), eos_token_id=token_id("eos_token_id"))
