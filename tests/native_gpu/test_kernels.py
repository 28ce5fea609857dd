"""Triton kernels vs their torch references: compiled on a GPU, else under TRITON_INTERPRET=1 on CPU
tensors in a child pytest (tests/helpers/triton_mode.py); the references' own checks run on CPU."""
import pytest
import torch
from helpers.triton_mode import DEVICE, needs_triton, run_interpreted, runs_the_child

pytest.importorskip("triton")
from modelplex_native_gpu.kernels import reference
from modelplex_native_gpu.kernels import triton_attention as tk

BLOCK_SIZE = 16
NUM_BLOCKS = 12


def make_cache(num_kv_heads, head_dim, seed=0, head_major=False, device="cpu"):
    """[num_blocks, block_size, Hkv, D]; head_major gives the CPU runner's permuted view of [Hkv, blocks, bs, D]."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_kv_heads, NUM_BLOCKS, BLOCK_SIZE, head_dim) if head_major else \
        (NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, head_dim)
    caches = torch.randn(shape, generator=g).to(device), torch.randn(shape, generator=g).to(device)
    return tuple(c.permute(1, 2, 0, 3) for c in caches) if head_major else caches


def block_tables_for(context_lens, max_blocks=5, device="cpu"):
    """Disjoint, shuffled block ids per sequence; block 0 (null) pads the rest."""
    ids = torch.randperm(NUM_BLOCKS - 1, generator=torch.Generator().manual_seed(1)) + 1
    tables, next_id = [], 0
    for n in context_lens:
        k = -(-n // BLOCK_SIZE)
        tables.append(ids[next_id:next_id + k].tolist() + [0] * (max_blocks - k))
        next_id += k
    return torch.tensor(tables, dtype=torch.int32, device=device)


@runs_the_child
def test_kernels_under_the_interpreter():
    """Without a GPU: the `triton` tests of this file, interpreted in a child process."""
    run_interpreted(__file__, "triton")


LAYOUTS = pytest.mark.parametrize("head_major", [False, True], ids=["token_major", "head_major"])


@needs_triton
@LAYOUTS
@pytest.mark.parametrize("head_dim", [32, 24])  # 24: not a power of two
def test_triton_store_kvcache_matches_reference_with_padded_slot(head_dim, head_major):
    k_cache, v_cache = make_cache(2, head_dim, head_major=head_major, device=DEVICE)
    key, value = torch.randn(5, 2, head_dim, device=DEVICE), torch.randn(5, 2, head_dim, device=DEVICE)
    slots = torch.tensor([3, 17, -1, 40, 15], dtype=torch.int64, device=DEVICE)  # 15 -> 16 crosses a block boundary
    want_k, want_v = k_cache.clone(), v_cache.clone()
    reference.store_kvcache(key, value, want_k, want_v, slots)
    tk.store_kvcache(key, value, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache, want_k, msg="key cache differs")
    torch.testing.assert_close(v_cache, want_v, msg="value cache differs")
    assert torch.equal(want_k.flatten(0, 1)[17], key[1])


@needs_triton
@LAYOUTS
@pytest.mark.parametrize("head_dim", [32, 24])
def test_triton_paged_decode_attention_matches_reference(head_dim, head_major):
    k_cache, v_cache = make_cache(2, head_dim, head_major=head_major, device=DEVICE)
    context_lens = torch.tensor([1, 17, 33], dtype=torch.int32, device=DEVICE)  # 17 and 33 cross block boundaries
    tables = block_tables_for(context_lens.tolist(), device=DEVICE)
    query = torch.randn(3, 4, head_dim, device=DEVICE)  # 4 query heads over 2 KV heads
    scale = head_dim ** -0.5
    want = reference.paged_decode_attention(query, k_cache, v_cache, tables, context_lens, scale)
    got = tk.paged_decode_attention(query, k_cache, v_cache, tables, context_lens, scale)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg="decode attention differs")


@needs_triton
@LAYOUTS
@pytest.mark.parametrize("head_dim", [32, 24])
def test_triton_prefix_prefill_attention_matches_reference(head_dim, head_major):
    k_cache, v_cache = make_cache(2, head_dim, head_major=head_major, device=DEVICE)
    context_lens = torch.tensor([20, 18, 5], dtype=torch.int32, device=DEVICE)
    q_lens = [20, 3, 5]  # fresh prefill, chunk after a 15-token cached prefix, short prompt
    cu_seqlens_q = torch.tensor([0, 20, 23, 28], dtype=torch.int32, device=DEVICE)
    tables = block_tables_for(context_lens.tolist(), device=DEVICE)
    query = torch.randn(sum(q_lens), 4, head_dim, device=DEVICE)
    scale = head_dim ** -0.5
    want = reference.prefix_prefill_attention(query, k_cache, v_cache, tables, cu_seqlens_q, context_lens, scale)
    got = tk.prefix_prefill_attention(query, k_cache, v_cache, tables, cu_seqlens_q, context_lens, scale)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg="prefill attention differs")


def test_decode_reference_equals_single_query_prefill():
    """The two references agree where they overlap: a one-token chunk is a decode."""
    k_cache, v_cache = make_cache(2, 32)
    context_lens = torch.tensor([17, 9], dtype=torch.int32)
    tables = block_tables_for(context_lens.tolist())
    query = torch.randn(2, 4, 32)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    a = reference.paged_decode_attention(query, k_cache, v_cache, tables, context_lens, 0.2)
    b = reference.prefix_prefill_attention(query, k_cache, v_cache, tables, cu, context_lens, 0.2)
    torch.testing.assert_close(a, b, msg="decode and prefill references disagree")


def test_decode_reference_groups_uneven_lengths_like_one_batch():
    """Sequences of very different lengths split into several gather groups: the result must not change."""
    k_cache, v_cache = torch.randn(81, BLOCK_SIZE, 2, 32), torch.randn(81, BLOCK_SIZE, 2, 32)
    g = torch.Generator().manual_seed(5)
    context_lens = torch.randint(1, 64, (20,), generator=g).to(torch.int32)
    tables = (torch.randperm(80, generator=g) + 1).view(20, 4).to(torch.int32)
    query = torch.randn(20, 4, 32, generator=g)
    plan = reference.plan_decode(tables, context_lens, BLOCK_SIZE)
    assert len(plan) > 1 and plan[-1].end == 20, "unsorted uneven lengths should need several groups"
    got = reference.paged_decode_attention(query, k_cache, v_cache, tables, context_lens, 0.3, plan)
    want = torch.cat([reference.paged_decode_attention(query[i:i + 1], k_cache, v_cache, tables[i:i + 1],
                                                       context_lens[i:i + 1], 0.3) for i in range(20)])
    torch.testing.assert_close(got, want, msg="grouped decode differs from per-sequence decode")


def test_decode_plan_pads_sorted_lengths_little():
    """Lengths sorted longest first group greedily while padding stays within 25 %; equal lengths need no mask."""
    tables = torch.arange(1, 6 * 4 + 1, dtype=torch.int32).view(6, 4)
    plan = reference.plan_decode(tables, torch.tensor([64, 60, 58, 20, 18, 18], dtype=torch.int32), BLOCK_SIZE)
    assert [(g.start, g.end, g.kv_len) for g in plan] == [(0, 3, 64), (3, 6, 20)]
    assert plan[0].block_tables.shape == (3, 4) and plan[1].block_tables.shape == (3, 2)
    same = reference.plan_decode(tables[:2], torch.tensor([33, 33], dtype=torch.int32), BLOCK_SIZE)
    assert len(same) == 1 and same[0].mask is None and same[0].kv_len == 33


def test_prefill_reference_with_fresh_keys_equals_cache_reads():
    """A chunk with no cached prefix may attend to its own K/V instead of gathering them from the cache."""
    k_cache, v_cache = make_cache(2, 32, head_major=True)
    context_lens = torch.tensor([20, 18, 5], dtype=torch.int32)
    cu_seqlens_q = torch.tensor([0, 20, 23, 28], dtype=torch.int32)
    tables = block_tables_for(context_lens.tolist())
    query, key, value = torch.randn(28, 4, 32), torch.randn(28, 2, 32), torch.randn(28, 2, 32)
    # sequences 0 and 2 are fresh prefills: their K/V go into the cache; sequence 1 reads its cached prefix
    for s, rows in ((0, slice(0, 20)), (2, slice(23, 28))):
        pos = torch.arange(rows.stop - rows.start)
        slots = tables[s, pos // BLOCK_SIZE].long() * BLOCK_SIZE + pos % BLOCK_SIZE
        reference.store_kvcache(key[rows], value[rows], k_cache, v_cache, slots)
    want = reference.prefix_prefill_attention(query, k_cache, v_cache, tables, cu_seqlens_q, context_lens, 0.2)
    got = reference.prefix_prefill_attention(query, k_cache, v_cache, tables, cu_seqlens_q, context_lens, 0.2,
                                             key=key, value=value)
    torch.testing.assert_close(got, want, msg="fresh-key prefill differs from the cache read")
