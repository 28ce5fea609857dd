"""Linear layers on GGUF-quantized weights (kernels/csrc/quant_linear.cpp): dequantization equals
gguf.quants.dequantize bit for bit, outputs within the derived bound of a float64 product
(helpers/quant_check.py), batch invariance; on the native build and the AVX2 and portable ones."""
import os
import subprocess
import sys

import pytest
import torch
from helpers.quant_check import check_ops, make_weight

from modelplex_native_gpu.kernels import cpu


def test_quantized_ops_match_gguf_and_float64(ops):
    worst = check_ops(ops)
    assert set(worst) == {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K", "Q4_0x16", "Q4_1x16", "Q8_0x16"}


def test_fused_silu_mlp_equals_its_parts(ops):
    """quant_silu_mlp is down(silu(gate) * up) on the fused gate/up, bit for bit the unfused ops (the silu the
    fp32 layer calls, ops.silu_and_mul)."""
    gate_up = torch.from_numpy(make_weight("Q8_0", 2 * 96, 64, seed=1))
    down = torch.from_numpy(make_weight("Q4_0", 64, 96, seed=2))
    for m in (1, 3):
        x = torch.randn(m, 64, generator=torch.Generator().manual_seed(m))
        want = ops.quant_linear(ops.silu_and_mul(ops.quant_linear(x, gate_up, 8, None)), down, 2, None)
        assert torch.equal(ops.quant_silu_mlp(x, gate_up, 8, down, 2), want)
    with pytest.raises(RuntimeError, match="even number of rows"):
        ops.quant_silu_mlp(x, torch.from_numpy(make_weight("Q8_0", 3, 64, seed=3)), 8, down, 2)


def test_bad_weights_are_refused(ops):
    data = torch.from_numpy(make_weight("Q8_0", 4, 64, seed=0))
    with pytest.raises(RuntimeError, match="bytes a row"):
        ops.quant_linear(torch.randn(2, 96), data, 8, None)  # in_features differ
    with pytest.raises(RuntimeError, match="unsupported GGML type"):
        ops.quant_linear(torch.randn(2, 64), data, 7, None)  # Q5_1
    with pytest.raises(RuntimeError, match="out of range"):
        ops.quant_dequantize(data, 8, 64, torch.tensor([4]))
    with pytest.raises(RuntimeError, match="no layout 1002 for GGML type 8"):
        ops.quant_repack_(data, 8, 1002)  # Q8_0's layout is 1008
    with pytest.raises(RuntimeError, match="no layout 1008 for GGML type 6"):
        ops.quant_repack_(torch.from_numpy(make_weight("Q5_0", 4, 64, seed=0)), 6, 1008)  # Q5_0 has none


@pytest.mark.parametrize("type_name, qtype, repacked", [("Q4_0", 2, 1002), ("Q8_0", 8, 1008)])
def test_repacked_where_the_build_has_the_kernel(ops, type_name, qtype, repacked):
    """A build with AVX-512 VNNI multiplies Q4_0, Q4_1 and Q8_0 fastest in 16-row groups; the repacking is in place
    and keeps the bytes of the last N % 16 rows."""
    has_kernel = {"avx512f", "avx512bw", "avx512_vnni"} <= set(cpu._cpu_flags().split())
    assert [ops.quant_repacked_type(t) for t in (2, 3, 8, 6)] == ([1002, 1003, 1008, 6] if has_kernel else [2, 3, 8, 6])
    data = torch.from_numpy(make_weight(type_name, 35, 64, seed=4))
    copy = data.clone()
    ops.quant_repack_(copy, qtype, repacked)
    assert not torch.equal(copy[:32], data[:32]) and torch.equal(copy[32:], data[32:])


OTHER_BUILD = """
import sys, torch
from torch.utils import cpp_extension
from helpers.quant_check import check_gemm, check_ops
cpp_extension.load(name="modelplex_quant_" + sys.argv[1], sources=sys.argv[2].split(","), is_python_module=False,
                   extra_cflags=["-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off"] + sys.argv[3:])
check_ops(torch.ops.modelplex_cpu)
check_gemm(torch.ops.modelplex_cpu)
print("ok")
"""


@pytest.mark.parametrize("flags", [["-mno-avx512f"], ["-mno-avx512f", "-mno-avx2", "-mno-fma"]], ids=["avx2", "portable"])
def test_the_avx2_and_portable_builds_match(flags):
    # quant_repack.cpp and quant_gemm.cpp beside quant_linear.cpp, which hands them repacked weights and
    # batches; linear.cpp for the packed fp32 reference
    csrc = os.path.join(os.path.dirname(cpu.__file__), "csrc")
    source = ",".join(os.path.join(csrc, f)
                      for f in ("quant_linear.cpp", "quant_repack.cpp", "quant_gemm.cpp", "linear.cpp"))
    tag = "avx2" if len(flags) == 1 else "portable"
    tests = os.path.dirname(os.path.dirname(__file__))
    result = subprocess.run([sys.executable, "-c", OTHER_BUILD, tag, source, *flags],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": _with_tests(tests)})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def _with_tests(tests: str) -> str:
    """PYTHONPATH for a child: the tests folder ahead of the inherited path (a checkout's packages first)."""
    return os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
