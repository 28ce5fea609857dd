"""ArchConfig: the architecture numbers of a supported model, from config.json (here) or GGUF (loader/gguf.py).

Family-specific fields default to "off", so a Llama config is the plain case. Anything the engine cannot
run (an unknown RoPE scaling type, activation or layer type) fails here, naming the field and the value.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelLoadError

# HF `architectures[0]` -> family (one model file per family under models/).
HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
ROPE_TYPES = ("default", "linear", "llama3", "longrope")
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


@dataclass
class ArchConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    rope_scaling: dict | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    family: str = "llama"
    qk_norm: bool = False  # RMSNorm over each query and key head before RoPE (Qwen3, Gemma 3)
    hidden_act: str = "silu"  # a key of ACTIVATIONS' values: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    layer_windows: tuple[int | None, ...] = ()  # per layer: sliding window in tokens, None = full; () = all full
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power (head_dim when None)
    local_rope_theta: float | None = None  # sliding layers' RoPE base (Gemma 3); None: rope_theta
    local_rope_scaling: dict | None = None
    partial_rotary_factor: float = 1.0  # share of head_dim that RoPE rotates (Phi-4-mini: 0.75)

    @property
    def window_of(self) -> list[int | None]:
        """Each layer's sliding window (None: full attention)."""
        return list(self.layer_windows) or [None] * self.num_hidden_layers

    @classmethod
    def from_hf(cls, cfg: dict) -> ArchConfig:
        arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
        family = HF_ARCHITECTURES.get(arch)
        if family is None:
            raise ModelLoadError(f"architectures: unsupported architecture {arch!r}; supported: "
                                 f"{sorted(HF_ARCHITECTURES)}")
        from .hf_config import family_fields

        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        fields = dict(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"], num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads, num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", arch == "Qwen2ForCausalLM"),
            bos_token_id=cfg.get("bos_token_id"), eos_token_id=eos[0] if isinstance(eos, list) else eos,
            family=family)
        fields.update(family_fields(family, cfg))
        config = cls(**fields)
        config.validate()
        return config

    def validate(self):
        """Refuse what no model file implements; the error names the field and its value."""
        for name in ("rope_scaling", "local_rope_scaling"):
            scaling = getattr(self, name)
            if scaling is not None:
                kind = scaling.get("rope_type", scaling.get("type", "default"))
                if kind not in ROPE_TYPES:
                    raise ModelLoadError(f"{name}.rope_type: unsupported value {kind!r}; supported: {ROPE_TYPES}")
        if self.hidden_act not in ACTIVATIONS.values():
            raise ModelLoadError(f"hidden_act: unsupported value {self.hidden_act!r}; supported: {sorted(ACTIVATIONS)}")
        if self.layer_windows and len(self.layer_windows) != self.num_hidden_layers:
            raise ModelLoadError(f"layer_types: {len(self.layer_windows)} entries for {self.num_hidden_layers} layers")
        bad = [w for w in self.layer_windows if w is not None and w <= 0]
        if bad:
            raise ModelLoadError(f"sliding_window: must be positive, got {bad[0]!r}")


def activation(name: str, field: str = "hidden_act") -> str:
    """HF's activation name -> ours, or a load error naming `field`."""
    if name not in ACTIVATIONS:
        raise ModelLoadError(f"{field}: unsupported value {name!r}; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]
