"""The torch reference attention with a sliding window and a logit soft-cap (the path Gemma and windowed
Phi-3 layers run) against dense attention written out: decode and prefill, blocks before the window
replaced by the null block, which holds garbage that must not be read."""
import pytest
import torch

from modelplex_native_gpu.kernels import reference

BS, NUM_BLOCKS, HKV, H, D = 8, 10, 2, 4, 16


def dense(q, keys, values, q_pos, window, softcap, scale):
    """q [L, H, D] at positions q_pos, keys/values [N, Hkv, D] at 0..N-1 -> [L, H, D]."""
    k, v = keys.repeat_interleave(H // HKV, 1), values.repeat_interleave(H // HKV, 1)
    scores = torch.einsum("lhd,nhd->hln", q, k) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    k_pos = torch.arange(keys.shape[0])
    visible = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] > q_pos[:, None] - (window or 10 ** 9))
    return torch.einsum("hln,nhd->lhd", torch.softmax(scores.masked_fill(~visible, float("-inf")), -1), v)


@pytest.mark.parametrize("window, softcap", [(12, None), (12, 0.7), (None, 0.7), (5, 2.0)])
def test_windowed_and_capped_attention_matches_dense(window, softcap):
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.randn(NUM_BLOCKS, BS, HKV, D, generator=g), torch.randn(NUM_BLOCKS, BS, HKV, D, generator=g)
    k_cache[0], v_cache[0] = 1e4, -1e4  # the null block: never written by the engine, never read here
    ctx = 35  # blocks 1..5 hold positions 0..34
    table = torch.tensor([[1, 2, 3, 4, 5]], dtype=torch.int32)
    keys, values = k_cache[1:6].flatten(0, 1)[:ctx], v_cache[1:6].flatten(0, 1)[:ctx]
    if window:  # what a sliding KV group holds after freeing: blocks wholly before the window are null
        first = (ctx - 7 - window + 1) // BS  # the prefill chunk below starts at position 28
        table[0, :first] = 0
    scale = 0.3
    q = torch.randn(7, H, D, generator=g)
    want = dense(q, keys, values, torch.arange(ctx - 7, ctx), window, softcap, scale)
    got = reference.prefix_prefill_attention(q, k_cache, v_cache, table, torch.tensor([0, 7], dtype=torch.int32),
                                             torch.tensor([ctx], dtype=torch.int32), scale, 7,
                                             sliding_window=window, softcap=softcap)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg="prefill chunk")
    got = reference.paged_decode_attention(q[-1:], k_cache, v_cache, table, torch.tensor([ctx], dtype=torch.int32),
                                           scale, sliding_window=window, softcap=softcap)
    torch.testing.assert_close(got, want[-1:], rtol=1e-5, atol=1e-5, msg="decode")
