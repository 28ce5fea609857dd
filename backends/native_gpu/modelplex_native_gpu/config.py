"""EngineConfig: every engine setting in one object, validated at construction."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidConfigError


@dataclass
class EngineConfig:
    """Settings of one engine. `device` None: cuda if available, else cpu. `dtype` None: the measured rule
    (dtype_rule.py: per device, CPU instruction set and quantized weights), logged at load with its reason.

    `dtype="float32"` is the token-exact mode (greedy output identical to HF transformers fp32).
    `quantized_weights`: a GGUF's quantized tensors (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K) stay in their
    blocks and linear layers multiply with them (True), or are dequantized to `dtype` at load (False). None
    keeps them quantized unless `dtype="float32"` asks for the token-exact mode. The kernels: the compiled
    CPU ops on CPU (without a compiler the weights are dequantized), Triton on CUDA (kernels/triton_quant.py:
    every type above; the embedding table and a tied LM head stay quantized too).
    `max_num_batched_tokens` of None means 2048 on CUDA and 256 on CPU, where a step's prefill tokens
    stall every running decode for their compute time (256 fp32 tokens of a 135M model: ~0.3 s).
    `kv_cache_memory_bytes` of None means `gpu_memory_utilization` of free memory on CUDA
    and `DEFAULT_CPU_KV_BYTES` on CPU. On CUDA, decode-only steps replay CUDA graphs captured per
    padded batch size (engine/cuda_graphs.py) unless `enforce_eager`.
    """

    model: str = ""
    device: str | None = None
    dtype: str | None = None
    quantized_weights: bool | None = None
    block_size: int = 16
    max_num_seqs: int = 128
    max_num_batched_tokens: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.8
    enable_prefix_caching: bool = True
    enforce_eager: bool = False  # CUDA: launch every kernel of every step instead of replaying CUDA graphs
    # Schedule and launch step N+1 before step N's tokens are read back (its sampled ids feed N+1 on the
    # device); an EOS or stop string then ends a request one step late, its extra token dropped. None: on CUDA.
    # Models with several KV-cache groups (sliding windows: Gemma 2/3) always step synchronously.
    async_scheduling: bool | None = None
    max_model_len: int | None = None
    num_threads: int | None = None
    adaptive_threads: bool = True  # CPU: fewer threads while other processes keep the cores busy
    seed: int = 0
    skip_tokenizer_init: bool = False  # token ids in and out only (no text prompts, no text deltas)
    # LoRA (modelplex_multilora): max_loras > 0 turns it on; that many adapters share a step.
    max_loras: int = 0
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # adapters kept in host memory; None: max(4 * max_loras, 16)
    # Serve from a process of the engine's own (engine/core_client.py), or from a thread of the server's
    # (engine/async_engine.py; tests and benchmarks). LLMEngine itself ignores it.
    engine_process: bool = True

    DEFAULT_CPU_KV_BYTES = 1 << 30
    DEFAULT_MAX_NUM_BATCHED_TOKENS = {"cuda": 2048, "cpu": 256}

    def __post_init__(self):
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if name == "max_num_batched_tokens" and value is None:
                continue
            if not isinstance(value, int) or value <= 0:
                raise InvalidConfigError(name, f"must be a positive integer, got {value!r}")
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise InvalidConfigError("dtype", f"must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise InvalidConfigError("kv_cache_memory_bytes", "must be positive")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InvalidConfigError("gpu_memory_utilization", "must be in (0, 1]")
        for name in ("max_loras", "max_lora_rank", "max_cpu_loras"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < (0 if name == "max_loras" else 1)):
                raise InvalidConfigError(name, f"must be a {'non-negative' if name == 'max_loras' else 'positive'} "
                                               f"integer, got {value!r}")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise InvalidConfigError("max_model_len", "must be positive")

    def keeps_quantized_weights(self) -> bool:
        return self.quantized_weights if self.quantized_weights is not None else self.dtype != "float32"

    def token_budget(self, device: str) -> int:
        """max_num_batched_tokens, or the device's default."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return self.DEFAULT_MAX_NUM_BATCHED_TOKENS["cuda" if device.startswith("cuda") else "cpu"]
