"""EngineConfig: every engine setting in one object, validated at construction."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidConfigError


@dataclass
class EngineConfig:
    """Settings of one engine. `device`/`dtype` of None pick cuda+bf16 if available, else cpu+bf16.

    `dtype="float32"` is the token-exact mode (greedy output identical to HF transformers fp32).
    `kv_cache_memory_bytes` of None means `gpu_memory_utilization` of free memory on CUDA
    and `DEFAULT_CPU_KV_BYTES` on CPU.
    """

    model: str = ""
    device: str | None = None
    dtype: str | None = None
    block_size: int = 16
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.8
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    num_threads: int | None = None
    seed: int = 0
    skip_tokenizer_init: bool = False  # token ids in and out only (no text prompts, no text deltas)

    DEFAULT_CPU_KV_BYTES = 1 << 30

    def __post_init__(self):
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise InvalidConfigError(name, f"must be a positive integer, got {value!r}")
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise InvalidConfigError("dtype", f"must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise InvalidConfigError("kv_cache_memory_bytes", "must be positive")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InvalidConfigError("gpu_memory_utilization", "must be in (0, 1]")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise InvalidConfigError("max_model_len", "must be positive")
