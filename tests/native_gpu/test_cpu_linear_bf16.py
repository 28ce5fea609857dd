"""The CPU path's bf16 linear layers (kernels/csrc/linear_bf16.cpp) against a float64 product of the same bf16
values, within the bound fp32 accumulation allows; and the build without AVX512_BF16, which registers nothing."""
import os
import subprocess
import sys

import pytest
import torch

from modelplex_native_gpu.kernels import cpu

U = 2.0 ** -24  # fp32 unit roundoff: bf16 x bf16 products are exact in fp32, each addition rounds once
U_BF16 = 2.0 ** -8  # the output's one rounding to bf16


@pytest.fixture(scope="module")
def bf16_ops(ops):
    if not hasattr(ops, "packed_linear_bf16"):
        pytest.skip("this CPU has no AVX512_BF16: the bf16 linear is not built (layers/linear.py keeps oneDNN)")
    return ops


def check(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, case: str):
    """|got - exact| <= (K + 1) u sum_k |x_k w_k| (+ |b|), plus half a bf16 ulp of the result for bf16 outputs."""
    xd, wd = x.bfloat16().double(), weight.bfloat16().double()
    exact = xd @ wd.T
    scale = xd.abs() @ wd.abs().T
    if bias is not None:
        bd = bias.double() if bias.dtype == torch.float32 else bias.bfloat16().double()
        exact, scale = exact + bd, scale + bd.abs()
    bound = (x.shape[1] + 1) * U * scale
    if got.dtype == torch.bfloat16:
        bound = bound + U_BF16 * (exact.abs() + bound)
    err = (got.double() - exact).abs()
    worst = (err - bound).argmax()
    assert bool((err <= bound).all()), (f"{case}: error {err.flatten()[worst]:.3g} > bound {bound.flatten()[worst]:.3g} "
                                        f"at {divmod(int(worst), got.shape[1])}")


# Ragged N (a partial last panel of 32 columns: 1000, 7, 33), odd K (a zero k pads the last pair), SmolLM2's sizes.
SHAPES = [(960, 576), (1000, 577), (7, 101), (33, 1536), (576, 64)]


@pytest.mark.parametrize("n,k", SHAPES)
def test_matches_the_float64_product_within_the_fp32_accumulation_bound(bf16_ops, n, k):
    g = torch.Generator().manual_seed(n * k)
    weight = torch.randn(n, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g).bfloat16()
    packed = bf16_ops.pack_linear_weight_bf16(weight)
    for m in (1, 3, 17, 64, 300):
        x = torch.randn(m, k, generator=g).bfloat16()
        for out_dtype in (None, torch.float32):
            for b in (bias, None):
                got = bf16_ops.packed_linear_bf16(x, packed, n, b, out_dtype)
                assert got.shape == (m, n) and got.dtype == (out_dtype or torch.bfloat16)
                check(got, x, weight, b, f"M={m} N={n} K={k} out={out_dtype} bias={b is not None}")


def test_a_tokens_outputs_do_not_depend_on_the_batch(bf16_ops):
    g = torch.Generator().manual_seed(1)
    weight, x = torch.randn(1000, 577, generator=g).bfloat16(), torch.randn(300, 577, generator=g).bfloat16()
    packed = bf16_ops.pack_linear_weight_bf16(weight)
    whole = bf16_ops.packed_linear_bf16(x, packed, 1000, None, torch.float32)
    for rows in [(0, 1), (5, 8), (17, 30), (299, 300), (64, 300)]:
        part = bf16_ops.packed_linear_bf16(x[rows[0]:rows[1]].clone(), packed, 1000, None, torch.float32)
        assert torch.equal(part, whole[rows[0]:rows[1]]), rows


def test_fp32_operands_and_strided_rows(bf16_ops):
    """fp32 weights, inputs and bias are rounded to bf16 (bias kept fp32); a column slice of a wider tensor is
    read in place, and gives the bits its contiguous copy gives."""
    g = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(100, 64, generator=g), torch.randn(100, generator=g)
    packed = bf16_ops.pack_linear_weight_bf16(weight)
    wide = torch.randn(17, 200, generator=g)
    x = wide[:, 10:74]
    got = bf16_ops.packed_linear_bf16(x, packed, 100, bias, torch.float32)
    check(got, x, weight, bias, "fp32 operands, strided rows")
    assert torch.equal(got, bf16_ops.packed_linear_bf16(x.contiguous().bfloat16(), packed, 100, bias, torch.float32))


def test_bad_shapes_are_refused(bf16_ops):
    packed = bf16_ops.pack_linear_weight_bf16(torch.randn(64, 32).bfloat16())
    x = torch.randn(2, 32).bfloat16()
    with pytest.raises(RuntimeError, match="packed"):
        bf16_ops.packed_linear_bf16(torch.randn(2, 48).bfloat16(), packed, 64, None, None)  # in_features differ
    with pytest.raises(RuntimeError, match="packed"):
        bf16_ops.packed_linear_bf16(x, packed, 65, None, None)  # more outputs than the panels hold
    with pytest.raises(RuntimeError, match="bias"):
        bf16_ops.packed_linear_bf16(x, packed, 64, torch.randn(63), None)
    with pytest.raises(RuntimeError, match="out_dtype"):
        bf16_ops.packed_linear_bf16(x, packed, 64, None, torch.float16)
    with pytest.raises(RuntimeError, match="packed"):
        bf16_ops.packed_linear_bf16(x, bf16_ops.pack_linear_weight(torch.randn(64, 32)), 64, None, None)  # fp32 panels


WITHOUT_BF16 = """
import sys, torch
from torch.utils import cpp_extension
cpp_extension.load(name="modelplex_linear_bf16_absent", sources=[sys.argv[1]], is_python_module=False,
                   extra_cflags=["-O3", "-march=native", "-mno-avx512bf16"])
print("registered" if hasattr(torch.ops.modelplex_cpu, "packed_linear_bf16") else "absent")
"""


def test_without_avx512_bf16_the_ops_are_not_registered():
    """Where the compiler does not target AVX512_BF16 the file builds to nothing: layers/linear.py then finds
    no packed_linear_bf16 and keeps oneDNN."""
    source = os.path.join(os.path.dirname(cpu.__file__), "csrc", "linear_bf16.cpp")
    result = subprocess.run([sys.executable, "-c", WITHOUT_BF16, source], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("absent"), result.stderr[-3000:]


def test_a_bf16_linear_layer_packs_into_the_panels_and_gives_fp32_logits(bf16_ops):
    """layers/linear.py: a bf16 weight goes into our panels (oneDNN's layout otherwise); forward rounds the
    sums to bf16 once, forward_fp32 (the LM head's logits) keeps them."""
    from modelplex_native_gpu.layers.linear import Linear

    g = torch.Generator().manual_seed(3)
    layer = Linear(96, 200, bias=True).to(torch.bfloat16)
    layer.load([torch.randn(200, 96, generator=g).bfloat16()])
    layer.bias.copy_(torch.randn(200, generator=g))
    weight = layer.weight.clone()
    layer.pack(batch_size_hint=64, cpu_ops=bf16_ops)
    assert layer.weight is None and layer.cpu_linear == bf16_ops.packed_linear_bf16
    x = torch.randn(9, 96, generator=g).bfloat16()
    logits = layer.forward_fp32(x)
    assert logits.dtype == torch.float32
    check(logits, x, weight, layer.bias, "forward_fp32")
    assert torch.equal(layer.forward(x), logits.bfloat16())
