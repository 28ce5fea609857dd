"""The batched form of the quantized linear layers (kernels/csrc/quant_gemm.cpp): bit for bit the fp32 packed
linear on gguf's dequantized weights, within its fp32 bound of a float64 product, batch invariant on its
side of quant_gemm_min_tokens; how far it moves outputs from the integer tiles at that threshold. The AVX2 and
portable builds run the same checks (test_quantized_linear.py)."""
import numpy as np
import pytest
import torch
from helpers.quant_check import INT8_TYPES, K_TYPES, check_gemm, dequantize, error_bound, gemm_bound, make_weight


def test_gemm_is_packed_linear_on_the_dequantized_weights(ops):
    worst = check_gemm(ops)
    assert set(worst) == set(INT8_TYPES + K_TYPES)


def test_thresholds(ops):
    """K-quants take it at every batch size (so their outputs never depend on the batch); the 32-weight types
    from a measured batch size up; types it does not know keep quant_linear's kernels."""
    for qtype in (12, 13, 14):
        assert ops.quant_gemm_min_tokens(qtype) == 1
    for qtype in (8, 2, 3, 6):
        assert 2 <= ops.quant_gemm_min_tokens(qtype) <= 64
    assert ops.quant_gemm_min_tokens(7) > 1 << 40  # Q5_1: not handled
    with pytest.raises(RuntimeError, match="unsupported GGML type"):
        ops.quant_gemm(torch.randn(2, 64), torch.from_numpy(make_weight("Q8_0", 4, 64, seed=0)), 7, None)
    with pytest.raises(RuntimeError, match="bytes a row"):
        ops.quant_gemm(torch.randn(2, 96), torch.from_numpy(make_weight("Q8_0", 4, 64, seed=0)), 8, None)


@pytest.mark.parametrize("type_name", INT8_TYPES)
def test_divergence_at_the_threshold_is_the_int16_activations(ops, type_name):
    """A token batched with fewer than quant_gemm_min_tokens others gets the integer tiles' outputs (int16
    activations), with more the GEMM's (fp32): the two differ by less than the int16 error bound plus the
    fp32 one, and the GEMM's are the closer to the float64 product (SmolLM2-sized rows, K = 576)."""
    import gguf

    qtype = int(gguf.GGMLQuantizationType[type_name])
    data = make_weight(type_name, 96, 576, seed=5)
    w = dequantize(type_name, data, 576)
    t = torch.from_numpy(data)
    x = torch.randn(ops.quant_gemm_min_tokens(qtype), 576, generator=torch.Generator().manual_seed(5))
    small = torch.cat([ops.quant_linear(x[i:i + 1], t, qtype, None) for i in range(len(x))])  # one token a call
    large = ops.quant_linear(x, t, qtype, None)
    assert torch.equal(large, ops.quant_gemm(x, t, qtype, None))
    want = x.double().numpy() @ w.astype(np.float64).T
    diff = np.abs(small.double().numpy() - large.double().numpy())
    assert (diff <= error_bound(type_name, w, x.numpy()) + gemm_bound(w, x.numpy())).all()
    assert np.abs(large.double().numpy() - want).mean() < np.abs(small.double().numpy() - want).mean()
