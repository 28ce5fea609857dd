"""The CPU path's fused layer ops (kernels/csrc/layer_ops.cpp) against the torch ops they replace."""
import pytest
import torch

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


def test_bad_shapes_are_refused(ops):
    layer = norm(64)
    with pytest.raises(RuntimeError, match="weight"):
        ops.rms_norm(torch.randn(2, 32), layer.weight, 1e-5)
    with pytest.raises(RuntimeError, match="cos/sin"):
        ops.rotary_embedding(torch.randn(2, 3, 64), torch.randn(3, 64), torch.randn(3, 64))
