"""ArchConfig from GGUF metadata: the `{arch}.*` keys llama.cpp's converter writes for each architecture.

Where llama.cpp hard-codes a value instead of storing it (Gemma's sliding-window pattern and local RoPE
base, Gemma's attention scale), the same default applies unless the file carries the key.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..models.config import ArchConfig

ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "qwen3",
                 "gemma2": "gemma2", "gemma3": "gemma3", "phi3": "phi3"}
_GEMMA_PATTERN = {"gemma2": 2, "gemma3": 6}  # llama.cpp: every Nth layer is global
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # llama.cpp scales queries by hidden/heads for these


def arch_config(meta: dict, arch: str, reader, read: Callable[[str], np.ndarray]) -> ArchConfig:
    """`read(name)` returns a tensor's fp32 values (Phi-3 keeps its LongRoPE factors as tensors)."""
    def get(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    names = {t.name for t in reader.tensors}
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    scaling = None
    if get("rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}

    def token_id(key):
        field = reader.fields.get(f"tokenizer.ggml.{key}")
        return int(field.contents()) if field is not None else None

    config = ArchConfig(
        vocab_size=int(embd.shape[1]), hidden_size=hidden, intermediate_size=int(get("feed_forward_length")),
        num_hidden_layers=int(get("block_count")), num_attention_heads=heads,
        num_key_value_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", hidden // heads)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        max_position_embeddings=int(get("context_length", 4096)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names, rope_scaling=scaling,
        bos_token_id=token_id("bos_token_id"), eos_token_id=token_id("eos_token_id"),
        family=ARCHITECTURES[arch])
    if config.family == "qwen3":
        config.qk_norm = True
    elif config.family in ("gemma2", "gemma3"):
        _gemma(config, arch, get)
    elif config.family == "phi3":
        _phi3(config, get, names, read)
    config.validate()
    return config


def _gemma(config: ArchConfig, arch: str, get):
    config.hidden_act = "gelu_tanh"
    config.qk_norm = arch == "gemma3"
    config.attn_logit_softcapping = get("attn_logit_softcapping")
    config.final_logit_softcapping = get("final_logit_softcapping")
    scale = get("attention.scale")
    if scale is not None:
        config.query_pre_attn_scalar = float(scale) ** -2
    elif config.num_hidden_layers == _GEMMA_27B_LAYERS[arch]:
        config.query_pre_attn_scalar = config.hidden_size / config.num_attention_heads
    else:
        config.query_pre_attn_scalar = config.head_dim
    if arch == "gemma3":
        config.local_rope_theta = float(get("rope.freq_base_swa", 10000.0))
    window = get("attention.sliding_window")
    if window:
        pattern = get("attention.sliding_window_pattern", _GEMMA_PATTERN[arch])
        if isinstance(pattern, list):  # one flag per layer, True = sliding
            is_sliding = [bool(p) for p in pattern]
        else:
            is_sliding = [int(pattern) == 0 or i % int(pattern) < int(pattern) - 1
                          for i in range(config.num_hidden_layers)]
        config.layer_windows = tuple(int(window) if s else None for s in is_sliding)


def _phi3(config: ArchConfig, get, names: set[str], read):
    rotary_dims = get("rope.dimension_count")
    if rotary_dims:
        config.partial_rotary_factor = int(rotary_dims) / config.head_dim
    window = get("attention.sliding_window")
    if window:  # 0: none (Phi-4)
        config.layer_windows = (int(window),) * config.num_hidden_layers
    if "rope_factors_long.weight" in names:
        config.rope_scaling = {
            "rope_type": "longrope", "long_factor": read("rope_factors_long.weight").tolist(),
            "short_factor": read("rope_factors_short.weight").tolist(),
            "original_max_position_embeddings": int(get("rope.scaling.original_context_length")),
            "max_position_embeddings": config.max_position_embeddings,
            "attention_factor": float(get("rope.scaling.attn_factor", 1.0))}
