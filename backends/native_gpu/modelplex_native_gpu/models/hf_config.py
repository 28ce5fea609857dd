"""Family-specific ArchConfig fields from an HF config.json: RoPE, sliding windows, soft-capping, activations.

Reads both spellings: transformers 5's `rope_parameters` (flat, or keyed by layer type for Gemma 3) and the
older `rope_theta` / `rope_scaling` / `rope_local_base_freq` / `sliding_window_pattern` that hub files carry.
"""
from __future__ import annotations

from ..errors import ModelLoadError
from .config import ROPE_TYPES, activation

_LAYER_TYPES = ("full_attention", "sliding_attention")


def family_fields(family: str, cfg: dict) -> dict:
    """The ArchConfig fields beyond the common ones, for `family`."""
    return {"llama": _llama, "qwen3": _qwen3, "gemma2": _gemma2, "gemma3": _gemma3, "phi3": _phi3}[family](cfg)


def _rope(cfg: dict, params: dict | None = None, default_theta: float = 10000.0, field: str | None = None) -> dict:
    """rope_theta and rope_scaling (None for plain RoPE) from `params` or the config's own keys; an
    unsupported type fails naming the config.json key it came from (`field`)."""
    if params is None:
        field = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
        params = cfg.get(field) or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES + ("su",):  # su: Phi-3's early name of longrope
        raise ModelLoadError(f"{field}.rope_type: unsupported value {kind!r}; supported: {ROPE_TYPES}")
    theta = params.get("rope_theta") or cfg.get("rope_theta") or default_theta
    return {"rope_theta": float(theta), "rope_scaling": None if kind == "default" else dict(params)}


def _windows(cfg: dict, default_types: list[str]) -> tuple[int | None, ...]:
    types = cfg.get("layer_types") or default_types
    bad = [t for t in types if t not in _LAYER_TYPES]
    if bad:
        raise ModelLoadError(f"layer_types: unsupported value {bad[0]!r}; supported: {_LAYER_TYPES}")
    if "sliding_attention" in types and not isinstance(cfg.get("sliding_window"), int):
        raise ModelLoadError(f"sliding_window: must be an integer, got {cfg.get('sliding_window')!r}")
    return tuple(cfg["sliding_window"] if t == "sliding_attention" else None for t in types)


def _llama(cfg: dict) -> dict:
    """Llama, Mistral, Qwen2: the fields as they were read before the other families (windows ignored)."""
    return _rope(cfg)


def _qwen3(cfg: dict) -> dict:
    windows = _windows(cfg, ["full_attention"] * cfg["num_hidden_layers"])
    return {**_rope(cfg), "qk_norm": True, "layer_windows": windows if any(windows) else (),
            "hidden_act": activation(cfg.get("hidden_act", "silu"))}


def _gemma_common(cfg: dict) -> dict:
    if cfg.get("use_bidirectional_attention"):
        raise ModelLoadError("use_bidirectional_attention: unsupported value True (causal decoding only)")
    return {"hidden_act": activation(cfg.get("hidden_activation") or cfg.get("hidden_act", "gelu_pytorch_tanh"),
                                     "hidden_activation"),
            "attn_logit_softcapping": cfg.get("attn_logit_softcapping"),
            "final_logit_softcapping": cfg.get("final_logit_softcapping"),
            "query_pre_attn_scalar": cfg.get("query_pre_attn_scalar")}


def _gemma2(cfg: dict) -> dict:
    n = cfg["num_hidden_layers"]
    default_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    return {**_gemma_common(cfg), **_rope(cfg), "layer_windows": _windows(cfg, default_types)}


def _gemma3(cfg: dict) -> dict:
    n, pattern = cfg["num_hidden_layers"], cfg.get("sliding_window_pattern", 6)
    default_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers 5: one RoPE per layer type
        full = _rope(cfg, params["full_attention"], 1e6, "rope_parameters.full_attention")
        local = _rope(cfg, params.get("sliding_attention", {}), field="rope_parameters.sliding_attention")
    else:
        full = _rope(cfg, cfg.get("rope_scaling") or {}, 1e6, "rope_scaling")
        local = {"rope_theta": float(cfg.get("rope_local_base_freq", 10000.0)), "rope_scaling": None}
    return {**_gemma_common(cfg), **full, "local_rope_theta": local["rope_theta"],
            "local_rope_scaling": local["rope_scaling"], "qk_norm": True,
            "layer_windows": _windows(cfg, default_types)}


def _phi3(cfg: dict) -> dict:
    rope = _rope(cfg)
    scaling = rope["rope_scaling"]
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) in ("longrope", "su"):
        scaling["rope_type"] = "longrope"
        scaling.setdefault("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
        scaling.setdefault("max_position_embeddings", cfg.get("max_position_embeddings", 4096))
    params = cfg.get("rope_parameters") or {}
    window = cfg.get("sliding_window")
    n = cfg["num_hidden_layers"]
    return {**rope, "hidden_act": activation(cfg.get("hidden_act", "silu")),
            "partial_rotary_factor": float(cfg.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))),
            "layer_windows": (window,) * n if window else ()}
