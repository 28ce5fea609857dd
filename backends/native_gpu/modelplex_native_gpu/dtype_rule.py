"""The engine's default dtype: a rule per device and CPU instruction set, set from measurements
(benchmarks/bf16_rule.py, benchmarks/results/bf16_rule.md). The engine logs the choice and its reason at
load; EngineConfig.dtype (config.pbtxt parameter `dtype`) overrides it."""
from __future__ import annotations

from dataclasses import dataclass

import torch

# CPU kind -> (dtype, why). Only avx512_bf16 is measured with this engine (AMD EPYC Zen 5, 2 threads).
CPU_RULES = {
    "amx": ("bfloat16", "AMX tiles multiply bf16 at ~5x the fp32 rate (1.7 TFLOP/s vs 250-380 GFLOP/s "
                        "measured on a Xeon slice); not measured with this engine"),
    "avx512_bf16": ("bfloat16", "bf16 measured 1.05-1.75x faster than float32 per CPU second (SmolLM2-135M and "
                                "Llama-3.2-1B shapes, batch and single stream; AMD EPYC Zen 5, 2026-11-26, "
                                "benchmarks/results/bf16_rule.md)"),
    "avx512": ("float32", "no bf16 dot products: oneDNN converts bf16 to fp32 at every multiply"),
    "avx2": ("float32", "no bf16 dot products: bf16 would cost conversions at every multiply"),
    "portable": ("float32", "no vector bf16 arithmetic"),
}


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str
    reason: str


def cpu_kind(flags: set[str]) -> str:
    """The CPU rule that applies to these /proc/cpuinfo flags."""
    if "amx_bf16" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "portable"


def choose_dtype(dtype: str | None, device: str, keeps_quantized: bool, flags: set[str] | None = None) -> DtypeChoice:
    """`dtype` (EngineConfig.dtype) when set, else the rule for `device`. `keeps_quantized`: the model's
    GGUF weights stay in their blocks on the CPU. `flags`: the CPU's (read from /proc/cpuinfo when None)."""
    if dtype:
        return DtypeChoice(dtype, "set by EngineConfig.dtype (config.pbtxt parameter `dtype`)")
    if device.startswith("cuda"):
        return DtypeChoice("bfloat16", "rule: cuda, tensor cores multiply bf16")
    if keeps_quantized:
        return DtypeChoice("float32", "rule: quantized weights, whose CPU kernels take fp32 activations "
                                      "(bf16 would add two conversions per linear)")
    kind = cpu_kind(cpu_flags() if flags is None else flags)
    chosen, why = CPU_RULES[kind]
    if chosen == "bfloat16" and not torch.backends.mkldnn.is_available():
        return DtypeChoice("float32", f"rule: {kind}, but this torch has no oneDNN for bf16 matmuls")
    return DtypeChoice(chosen, f"rule: {kind}, {why}")


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())
