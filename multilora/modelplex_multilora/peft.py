"""PEFT LoRA adapters on disk: `adapter_config.json` + `adapter_model.safetensors`, read and checked
against the base model's shapes before any weight is loaded.

Stdlib only (a safetensors header is JSON), so any backend can check an adapter with it;
`modelplex_multilora.weights` then reads the tensors with torch. Every refusal is an
`InvalidAdapterError` (a 400) whose message says what is wrong.
"""
from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from modelplex import InvalidInput

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The projections an adapter may target, as PEFT names them in a Llama-family model.
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])"
                  r"(?:\.[A-Za-z_][\w-]*)?\.weight")
_DTYPES = ("F32", "F16", "BF16")
_MAX_HEADER_BYTES = 100 << 20
# PEFT options that change what the adapter computes beyond x @ A^T @ B^T * scaling: refused by name.
_UNSUPPORTED = ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save", "fan_in_fan_out", "lora_bias",
                "target_parameters", "trainable_token_indices", "layer_replication", "alora_invocation_tokens",
                "use_qalora")


class InvalidAdapterError(InvalidInput):
    """An adapter folder that cannot be served, and why."""


@dataclass(frozen=True)
class BaseModelShape:
    """What an adapter must fit: the layer count and each projection's (in_features, out_features)."""

    num_layers: int
    modules: dict[str, tuple[int, int]]

    @classmethod
    def llama(cls, hidden_size: int, intermediate_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
              head_dim: int) -> BaseModelShape:
        q, kv = num_heads * head_dim, num_kv_heads * head_dim
        return cls(num_layers, {"q_proj": (hidden_size, q), "k_proj": (hidden_size, kv), "v_proj": (hidden_size, kv),
                                "o_proj": (q, hidden_size), "gate_proj": (hidden_size, intermediate_size),
                                "up_proj": (hidden_size, intermediate_size),
                                "down_proj": (intermediate_size, hidden_size)})


@dataclass(frozen=True)
class AdapterSpec:
    """A checked adapter: rank, scaling (alpha / r, or alpha / sqrt(r) with rsLoRA) and, for each
    (layer, module) it adapts, the safetensors keys of its A ([r, in]) and B ([out, r]) matrices."""

    path: Path
    rank: int
    lora_alpha: float
    use_rslora: bool
    target_modules: tuple[str, ...]
    tensors: dict[tuple[int, str], tuple[str, str]]

    @property
    def scaling(self) -> float:
        return self.lora_alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    @property
    def weights_file(self) -> Path:
        return self.path / WEIGHTS_FILE

    def summary(self) -> dict:
        return {"rank": self.rank, "lora_alpha": self.lora_alpha, "use_rslora": self.use_rslora,
                "target_modules": list(self.target_modules)}


def read_adapter(path: Path, base: BaseModelShape, max_lora_rank: int) -> AdapterSpec:
    """Read and check the adapter folder `path`; raises InvalidAdapterError with the reason."""
    path = Path(path)
    config = _read_config(path)
    rank, alpha, rslora = _check_config(config, max_lora_rank)
    header = read_safetensors_header(path / WEIGHTS_FILE)
    tensors = _pair_tensors(header, base, rank)
    declared = config.get("target_modules")
    targets = tuple(m for m in MODULES if any(module == m for _, module in tensors))
    if isinstance(declared, list):
        lacking = sorted(set(declared) - set(MODULES))
        if lacking:
            raise InvalidAdapterError(f"target modules the base model lacks: {', '.join(lacking)} (it has "
                                      f"{', '.join(MODULES)})")
    return AdapterSpec(path, rank, alpha, rslora, targets, tensors)


def _read_config(path: Path) -> dict:
    if not path.is_dir():
        raise InvalidAdapterError(f"no adapter folder at {path}")
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise InvalidAdapterError(f"{CONFIG_FILE} is missing in {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidAdapterError(f"{CONFIG_FILE} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise InvalidAdapterError(f"{CONFIG_FILE} must hold a JSON object")
    return config


def _check_config(config: dict, max_lora_rank: int) -> tuple[int, float, bool]:
    """(rank, lora_alpha, use_rslora) of a plain LoRA config; anything it cannot serve is refused."""
    if config.get("peft_type", "LORA") != "LORA":
        raise InvalidAdapterError(f"peft_type {config['peft_type']!r} is not LORA")
    rank, alpha = config.get("r", 8), config.get("lora_alpha", 8)
    if type(rank) is not int or rank <= 0:
        raise InvalidAdapterError(f"r must be a positive integer, got {rank!r}")
    if rank > max_lora_rank:
        raise InvalidAdapterError(f"rank {rank} is over max_lora_rank {max_lora_rank}")
    if type(alpha) not in (int, float) or not math.isfinite(alpha):
        raise InvalidAdapterError(f"lora_alpha must be a number, got {alpha!r}")
    unsupported = [key for key in _UNSUPPORTED if config.get(key)]
    if config.get("layers_to_transform") is not None:
        unsupported.append("layers_to_transform")
    if config.get("bias", "none") not in ("none", None):
        unsupported.append("bias")
    if unsupported:
        key = unsupported[0]
        raise InvalidAdapterError(f"{key} is not supported (got {config[key]!r})")
    return rank, float(alpha), bool(config.get("use_rslora", False))


def read_safetensors_header(file: Path) -> dict[str, dict]:
    """Tensor name -> {dtype, shape, data_offsets}, from the file's JSON header (no tensor is read)."""
    try:
        with open(file, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            raw = f.read(8)
            (length,) = struct.unpack("<Q", raw) if len(raw) == 8 else (None,)
            if length is None or length > min(size - 8, _MAX_HEADER_BYTES):
                raise InvalidAdapterError(f"{file.name} is not a safetensors file")
            header = json.loads(f.read(length))
    except FileNotFoundError:
        raise InvalidAdapterError(f"{WEIGHTS_FILE} is missing in {file.parent}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidAdapterError(f"{file.name} has an unreadable header: {e}") from None
    if not isinstance(header, dict):
        raise InvalidAdapterError(f"{file.name} has an unreadable header")
    header.pop("__metadata__", None)
    return header


def _pair_tensors(header: dict, base: BaseModelShape, rank: int) -> dict[tuple[int, str], tuple[str, str]]:
    """(layer, module) -> (A key, B key), each shape checked against the base model."""
    found: dict[tuple[int, str], dict[str, str]] = {}
    for key, info in header.items():
        match = _KEY.fullmatch(key)
        if match is None:
            raise InvalidAdapterError(f"tensor {key!r} is not a LoRA A/B weight of a projection "
                                      f"({', '.join(MODULES)})")
        layer, module, which = int(match[1]), match[2], match[3]
        if module not in base.modules:
            raise InvalidAdapterError(f"target modules the base model lacks: {module} (tensor {key!r})")
        if layer >= base.num_layers:
            raise InvalidAdapterError(f"tensor {key!r}: the base model has {base.num_layers} layers")
        if not isinstance(info, dict) or info.get("dtype") not in _DTYPES:
            raise InvalidAdapterError(f"tensor {key!r}: dtype must be one of {', '.join(_DTYPES)}")
        in_features, out_features = base.modules[module]
        want = [rank, in_features] if which == "A" else [out_features, rank]
        if info.get("shape") != want:
            raise InvalidAdapterError(f"tensor {key!r} has shape {info.get('shape')} but the base model needs "
                                      f"{want} (rank {rank}, {module} {in_features} -> {out_features})")
        found.setdefault((layer, module), {})[which] = key
    if not found:
        raise InvalidAdapterError(f"{WEIGHTS_FILE} holds no LoRA weights")
    pairs = {}
    for (layer, module), keys in sorted(found.items()):
        if set(keys) != {"A", "B"}:
            missing = "B" if "A" in keys else "A"
            raise InvalidAdapterError(f"layer {layer} {module} has no lora_{missing} weight")
        pairs[(layer, module)] = (keys["A"], keys["B"])
    return pairs
