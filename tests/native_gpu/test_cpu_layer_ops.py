"""The CPU path's fused layer ops (kernels/csrc/layer_ops.cpp) against the torch ops they replace."""
import pytest
import torch
import torch.nn.functional as F

from modelplex_native_gpu.layers.norm import RMSNorm
from modelplex_native_gpu.layers.rotary import RotaryEmbedding


def norm(hidden, seed=0):
    layer = RMSNorm(hidden, 1e-5)
    layer.weight.copy_(torch.randn(hidden, generator=torch.Generator().manual_seed(seed)))
    return layer


@pytest.mark.parametrize("tokens,hidden", [(1, 576), (37, 576), (3, 100)])  # 100: not a multiple of 8
def test_rms_norm_and_the_fused_residual_add_match_torch(ops, tokens, hidden):
    g = torch.Generator().manual_seed(tokens)
    layer = norm(hidden)
    x, residual = torch.randn(tokens, hidden, generator=g), torch.randn(tokens, hidden, generator=g) * 4
    torch.testing.assert_close(layer.norm(x, ops), layer.forward(x), rtol=2e-6, atol=1e-6)
    want_x, want_residual = layer.add_and_norm(x, residual)
    got_x, got_residual = layer.add_and_norm(x.clone(), residual.clone(), ops)
    assert torch.equal(got_residual, want_residual)  # the add is the same single rounding
    torch.testing.assert_close(got_x, want_x, rtol=2e-6, atol=1e-6)


def test_rotary_embedding_in_place_is_bit_identical_to_torch(ops):
    """On q and k heads as the model passes them: a strided slice of the step's qkv rows."""
    g = torch.Generator().manual_seed(3)
    rope = RotaryEmbedding(64, 512, 10000.0)
    positions = torch.tensor([0, 5, 17, 511, 200])
    cos, sin = rope.table(positions, torch.float32)
    qkv = torch.randn(5, (9 + 3 + 3) * 64, generator=g)
    qk = qkv[:, :12 * 64].view(5, 12, 64)
    want = RotaryEmbedding.apply(qk, cos, sin)
    v_before = qkv[:, 12 * 64:].clone()
    ops.rotary_embedding(qk, cos, sin)
    assert torch.equal(qk, want)
    assert torch.equal(qkv[:, 12 * 64:], v_before)  # the value heads beside them are untouched


# A float rounded to bf16 (8 significant bits, to nearest) is off by at most 2^-8 of itself.
BF16_ROUNDING = 2 ** -8


@pytest.mark.parametrize("tokens,hidden", [(1, 576), (37, 576), (3, 100)])
def test_bf16_norm_is_within_two_roundings_of_float64(ops, tokens, hidden):
    """bf16 rows: the statistics in fp32, x * rsqrt rounded to bf16, times the bf16 weight rounded again (as
    RMSNorm.forward). Bound: those two roundings, 2 * 2^-8 of the float64 result (fp32 noise is far below);
    torch's bf16 ops differ only in the order of the fp32 sum of squares: equal nearly everywhere."""
    g = torch.Generator().manual_seed(tokens)
    layer = norm(hidden).to(torch.bfloat16)
    x = torch.randn(tokens, hidden, generator=g).bfloat16()
    residual = (torch.randn(tokens, hidden, generator=g) * 4).bfloat16()
    want_residual = (x.double() + residual.double()).bfloat16()  # the add rounds once
    got_x, got_residual = layer.add_and_norm(x.clone(), residual.clone(), ops)
    assert torch.equal(got_residual, want_residual)
    for got, rows in ((got_x, want_residual), (layer.norm(x, ops), x)):
        exact = layer.weight.double() * rows.double() * (rows.double().pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt()
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.double(), exact, rtol=2 * BF16_ROUNDING, atol=1e-12)
    torch_x, torch_residual = layer.add_and_norm(x, residual)
    assert torch.equal(torch_residual, got_residual)
    torch.testing.assert_close(got_x.double(), torch_x.double(), rtol=2 * BF16_ROUNDING, atol=0)
    assert (got_x == torch_x).double().mean() > 0.99


def test_bf16_rotary_embedding_is_bit_identical_to_torchs_bf16_ops(ops):
    """Each product and sum rounded to bf16 as torch's bf16 ops round them (the reference HF runs at bf16);
    their distance to the float64 rotation of the same bf16 inputs is bounded by those three roundings."""
    g = torch.Generator().manual_seed(4)
    rope = RotaryEmbedding(64, 512, 10000.0)
    positions = torch.tensor([0, 5, 17, 511, 200])
    cos, sin = rope.table(positions, torch.bfloat16)
    qkv = torch.randn(5, (9 + 3 + 3) * 64, generator=g).bfloat16()
    qk = qkv[:, :12 * 64].view(5, 12, 64)
    want = RotaryEmbedding.apply(qk, cos, sin)
    exact = RotaryEmbedding.apply(qk.double(), cos.double(), sin.double())
    terms = qk.double().abs() * cos.double().abs() + qk.double().roll(32, -1).abs() * sin.double().abs()
    v_before = qkv[:, 12 * 64:].clone()
    ops.rotary_embedding(qk, cos, sin)
    assert torch.equal(qk, want)
    assert torch.equal(qkv[:, 12 * 64:], v_before)
    assert ((qk.double() - exact).abs() <= BF16_ROUNDING * (terms + exact.abs())).all()


@pytest.mark.parametrize("tokens,intermediate", [(1, 1536), (37, 1536), (3, 100)])
def test_bf16_silu_and_mul_is_torchs_bf16_swiglu_within_its_roundings(ops, tokens, intermediate):
    """silu(gate) rounded to bf16, times up rounded again, where F.silu(gate).mul_(up) rounds (100: the
    scalar tail). Against float64: those two roundings; against torch: equal but where the two exps (Sleef's,
    our polynomial) put the fp32 silu on either side of a bf16 rounding boundary. Large |gate|: exp's range."""
    g = torch.Generator().manual_seed(tokens)
    gate_up = (torch.randn(tokens, 2 * intermediate, generator=g) * 4).bfloat16()
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, -88.5, 0.0])
    gate, up = gate_up.split(intermediate, dim=-1)
    got = ops.silu_and_mul(gate_up)
    want = F.silu(gate).mul_(up)
    exact = F.silu(gate.double()) * up.double()
    assert got.dtype == torch.bfloat16 and got.shape == (tokens, intermediate)
    torch.testing.assert_close(got.double(), exact, rtol=2 * BF16_ROUNDING, atol=1e-30)
    assert (got == want).double().mean() > 0.999
    with pytest.raises(RuntimeError, match="gate_up"):
        ops.silu_and_mul(gate_up.half())


# An fp32 rounding is off by at most 2^-24 of itself; an ulp is 2^-23 relative (within a factor 2).
FP32_ULP = 2 ** -23
UNDER = 3e-37  # |silu(gate)| where exp(-gate) overflows fp32 (gate < -88.72)


@pytest.mark.parametrize("tokens,intermediate", [(1, 1536), (37, 1536), (3, 100)])
def test_fp32_silu_and_mul_is_within_3_ulps_of_float64(ops, tokens, intermediate):
    """fp32 silu(gate) * up with the op's vector exp (1.26 ulps at worst, checked on every float) and three
    roundings (1 + exp, the division, the product): within 3 ulps of float64 on the same inputs, and as close to
    torch's fp32 SwiGLU. 100: the masked tail. Large |gate|: exp's range (below -88.7, exp(-gate) overflows and
    silu(gate) is -0 where it is -2.5e-37 or less, in torch's formula too: UNDER covers it)."""
    g = torch.Generator().manual_seed(tokens)
    gate_up = torch.randn(tokens, 2 * intermediate, generator=g) * 8
    gate_up[0, :6] = torch.tensor([-100.0, 100.0, -88.5, 0.0, -104.5, 89.5])
    gate, up = gate_up.split(intermediate, dim=-1)
    got = ops.silu_and_mul(gate_up)
    exact = F.silu(gate.double()) * up.double()
    assert got.dtype == torch.float32 and got.shape == (tokens, intermediate)
    assert ((got.double() - exact).abs() <= 3 * FP32_ULP * exact.abs() + UNDER * up.abs()).all()
    torch.testing.assert_close(got, F.silu(gate).mul_(up), rtol=4 * FP32_ULP, atol=1e-43)


def test_fp32_silu_and_mul_over_the_exp_range(ops):
    """A dense sweep of gate over [-110, 95] (exp(-gate) from overflow to underflow), up = 1: within 3 ulps of
    float64 everywhere but where exp(-gate) overflows."""
    gate = torch.linspace(-110, 95, 1 << 20)
    got = ops.silu_and_mul(torch.cat((gate, torch.ones_like(gate))).view(1, -1))
    exact = F.silu(gate.double())
    assert ((got[0].double() - exact).abs() <= 3 * FP32_ULP * exact.abs() + UNDER).all()
    assert (got[0][gate > -88.7] != 0).all()  # no early underflow


def test_bad_shapes_are_refused(ops):
    layer = norm(64)
    with pytest.raises(RuntimeError, match="weight"):
        ops.rms_norm(torch.randn(2, 32), layer.weight, 1e-5)
    with pytest.raises(RuntimeError, match="cos/sin"):
        ops.rotary_embedding(torch.randn(2, 3, 64), torch.randn(3, 64), torch.randn(3, 64))
    with pytest.raises(RuntimeError, match="weight"):  # dtypes must agree
        ops.rms_norm(torch.randn(2, 64).bfloat16(), layer.weight, 1e-5)
    with pytest.raises(RuntimeError, match="cos/sin"):
        ops.rotary_embedding(torch.randn(2, 3, 64).bfloat16(), torch.randn(2, 64), torch.randn(2, 64))
    with pytest.raises(RuntimeError, match="fp32 or bf16"):
        ops.rms_norm(torch.randn(2, 64).half(), layer.weight.half(), 1e-5)
