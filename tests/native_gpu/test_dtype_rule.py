"""The default dtype: the measured rule per CPU kind, quantized weights and CUDA, an explicit dtype winning,
and the choice with its reason logged when an engine loads."""
import logging

import pytest

from modelplex_native_gpu.dtype_rule import CPU_RULES, choose_dtype, cpu_flags, cpu_kind

AMX = {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}
ZEN5 = {"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}
SKYLAKE_X = {"avx2", "fma", "avx512f", "avx512bw"}
AVX2 = {"avx2", "fma"}


@pytest.mark.parametrize(("flags", "kind", "dtype"), [
    (AMX, "amx", "bfloat16"), (SKYLAKE_X, "avx512", "float32"), (AVX2, "avx2", "float32"),
    (set(), "portable", "float32")])
def test_cpu_rule_per_instruction_set(flags, kind, dtype):
    assert cpu_kind(flags) == kind
    choice = choose_dtype(None, "cpu", keeps_quantized=False, flags=flags)
    assert choice.dtype == dtype
    assert choice.reason.startswith(f"rule: {kind}, ")


def test_avx512_bf16_follows_the_measurement():
    choice = choose_dtype(None, "cpu", keeps_quantized=False, flags=ZEN5)
    assert choice.dtype == CPU_RULES["avx512_bf16"][0]
    assert "measured" in choice.reason and "bf16_rule.md" in choice.reason


def test_explicit_dtype_quantized_weights_and_cuda():
    assert choose_dtype("bfloat16", "cpu", keeps_quantized=True, flags=AVX2).dtype == "bfloat16"
    assert "EngineConfig.dtype" in choose_dtype("float32", "cpu", keeps_quantized=False, flags=AMX).reason
    quantized = choose_dtype(None, "cpu", keeps_quantized=True, flags=AMX)
    assert quantized.dtype == "float32" and "quantized" in quantized.reason
    assert choose_dtype(None, "cuda", keeps_quantized=False, flags=AVX2).dtype == "bfloat16"


def test_engine_logs_its_dtype_and_why(tiny_family_model, engine_for, caplog):
    _, folder = tiny_family_model("qwen3")
    with caplog.at_level(logging.INFO, logger="modelplex_native_gpu.engine.llm_engine"):
        engine = engine_for(folder, dtype=None)
    kind = cpu_kind(cpu_flags())
    expected = CPU_RULES[kind][0]
    assert engine.runner.dtype.__repr__() == f"torch.{expected}"
    assert f"dtype {expected} (rule: {kind}, " in caplog.text
    with caplog.at_level(logging.INFO, logger="modelplex_native_gpu.engine.llm_engine"):
        engine_for(folder, dtype="float32")
    assert "dtype float32 (set by EngineConfig.dtype" in caplog.text
