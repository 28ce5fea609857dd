"""The CPU path's compiled paged attention (decode and prefill) vs the torch reference (the ops are built
on first use)."""
import pytest
import torch

from modelplex_native_gpu.kernels import cpu, reference

BLOCK_SIZE = 16


@pytest.fixture(scope="module", autouse=True)
def compiled():
    if cpu.compiled_ops() is None:
        pytest.fail("the CPU decode-attention op did not build (gcc and ninja are installed by `make`)")


def make_case(batch, num_heads, num_kv_heads, head_dim, context_lens, dtype=torch.float32, num_blocks=64, seed=0):
    """Caches in the CPU runner's head-major layout, shuffled disjoint block tables padded with the null block."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_kv_heads, num_blocks, BLOCK_SIZE, head_dim)
    k_cache, v_cache = (torch.randn(shape, generator=g).to(dtype).permute(1, 2, 0, 3) for _ in range(2))
    max_blocks = max(-(-n // BLOCK_SIZE) for n in context_lens) + 1  # one padded column
    ids = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    tables = []
    for n in context_lens:
        k = -(-n // BLOCK_SIZE)
        tables.append([ids.pop() for _ in range(k)] + [0] * (max_blocks - k))
    query = torch.randn(batch, num_heads, head_dim, generator=g).to(dtype)
    return query, k_cache, v_cache, torch.tensor(tables, dtype=torch.int32), torch.tensor(context_lens, dtype=torch.int32)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [
    (9, 3, 64),   # SmolLM2-135M: 3 query heads per KV head
    (4, 4, 32),   # no GQA
    (8, 2, 24),   # head size not a multiple of 8: the scalar path
    (6, 1, 80),   # head size not a multiple of 32: the 8-float tail
])
def test_matches_reference(num_heads, num_kv_heads, head_dim):
    # 1: a single token; 16/17: at and across a block boundary; 100 and 203: many blocks, a partial tail
    lens = [1, 16, 17, 100, 203]
    case = make_case(len(lens), num_heads, num_kv_heads, head_dim, lens)
    scale = head_dim ** -0.5
    got = cpu.paged_decode_attention(*case, scale)
    want = reference.paged_decode_attention(*case, scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# bf16: K/V widened to fp32 as read, the fp32 kernels' arithmetic, one rounding of the output to bf16. Bound
# against float64 attention over the same bf16 inputs: half a bf16 ulp (rtol 2^-8 covers it) plus fp32 noise.
BF16_RTOL, BF16_ATOL = 2 ** -8, 1e-5


def float64_case(case):
    return [t.double() if t.is_floating_point() else t for t in case]


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(9, 3, 64), (8, 2, 24), (6, 1, 80)])
def test_bfloat16_decode_is_within_a_rounding_of_float64(num_heads, num_kv_heads, head_dim):
    """(9, 3, 64): the AVX-512 passes; 24: the scalar ones; 80: vector scores, scalar values."""
    lens = [1, 16, 17, 100, 203]
    case = make_case(len(lens), num_heads, num_kv_heads, head_dim, lens, dtype=torch.bfloat16)
    scale = head_dim ** -0.5
    got = cpu.paged_decode_attention(*case, scale)
    want = reference.paged_decode_attention(*float64_case(case), scale)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=BF16_RTOL, atol=BF16_ATOL)


def test_padding_and_other_blocks_are_never_read():
    """NaN in the null block and in every block a sequence does not own must not reach the output."""
    query, k_cache, v_cache, tables, lens = make_case(2, 4, 2, 32, [5, 33])
    owned = set(tables[0, :1].tolist()) | set(tables[1, :3].tolist())
    for b in range(k_cache.shape[0]):
        if b not in owned:
            k_cache[b], v_cache[b] = float("nan"), float("nan")
    k_cache[tables[1, 2], 1:], v_cache[tables[1, 2], 1:] = float("nan"), float("nan")  # slots past token 33
    out = cpu.paged_decode_attention(query, k_cache, v_cache, tables, lens, 0.2)
    assert torch.isfinite(out).all()


def test_a_context_longer_than_the_table_is_refused():
    query, k_cache, v_cache, tables, _ = make_case(1, 4, 2, 32, [20])
    with pytest.raises(RuntimeError, match="context length out of range"):
        cpu.paged_decode_attention(query, k_cache, v_cache, tables, torch.tensor([500], dtype=torch.int32), 0.2)


def test_a_block_id_outside_the_cache_is_refused():
    query, k_cache, v_cache, tables, lens = make_case(1, 4, 2, 32, [20])
    tables[0, 1] = k_cache.shape[0]  # one past the last block
    with pytest.raises(RuntimeError, match="block id out of range"):
        cpu.paged_decode_attention(query, k_cache, v_cache, tables, lens, 0.2)


def make_prefill_case(chunks, num_heads, num_kv_heads, head_dim, num_blocks=64, seed=1):
    """`chunks`: (query tokens, context length) per sequence; a chunk is the last tokens of its context."""
    query, k_cache, v_cache, tables, lens = make_case(1, num_heads, num_kv_heads, head_dim, [c for _, c in chunks],
                                                      num_blocks=num_blocks, seed=seed)
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0] + torch.tensor([q for q, _ in chunks]).cumsum(0).tolist(), dtype=torch.int32)
    query = torch.randn(int(cu[-1]), num_heads, head_dim, generator=g)
    return query, k_cache, v_cache, tables, cu, lens


# Whole prompts (37, 16 at a block's end), chunks after a cached prefix (13 of 33, 24 crossing a block
# boundary), one token after a long prefix, and a chunk longer than one 8-token task.
PREFILL_CHUNKS = [(37, 37), (16, 16), (13, 33), (24, 40), (1, 101), (70, 90)]


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(9, 3, 64), (4, 4, 32), (8, 2, 24), (6, 1, 80)])
def test_prefill_matches_reference(num_heads, num_kv_heads, head_dim):
    case = make_prefill_case(PREFILL_CHUNKS, num_heads, num_kv_heads, head_dim)
    scale = head_dim ** -0.5
    got = cpu.compiled_ops().prefill_attention(*case, scale)
    want = reference.prefix_prefill_attention(*case, scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(cpu.prefix_prefill_attention(*case, scale), got)  # what the layer calls in fp32


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(9, 3, 64), (8, 2, 24)])
def test_bfloat16_prefill_is_within_a_rounding_of_float64(num_heads, num_kv_heads, head_dim):
    query, *rest = make_prefill_case(PREFILL_CHUNKS, num_heads, num_kv_heads, head_dim)
    case = [query.bfloat16(), rest[0].bfloat16(), rest[1].bfloat16(), *rest[2:]]
    scale = head_dim ** -0.5
    got = cpu.compiled_ops().prefill_attention(*case, scale)
    want = reference.prefix_prefill_attention(*float64_case(case), scale)
    torch.testing.assert_close(got.double(), want, rtol=BF16_RTOL, atol=BF16_ATOL)
    assert torch.equal(cpu.prefix_prefill_attention(*case, scale), got)  # what the layer calls at bf16 too


def test_prefill_reads_no_padding_other_blocks_or_later_slots():
    query, k_cache, v_cache, tables, cu, lens = make_prefill_case([(5, 5), (10, 35)], 4, 2, 32)
    owned = set(tables[0, :1].tolist()) | set(tables[1, :3].tolist())
    for b in range(k_cache.shape[0]):
        if b not in owned:
            k_cache[b], v_cache[b] = float("nan"), float("nan")
    k_cache[tables[0, 0], 5:], v_cache[tables[0, 0], 5:] = float("nan"), float("nan")  # past token 5
    k_cache[tables[1, 2], 3:], v_cache[tables[1, 2], 3:] = float("nan"), float("nan")  # past token 35
    assert torch.isfinite(cpu.compiled_ops().prefill_attention(query, k_cache, v_cache, tables, cu, lens, 0.2)).all()


def test_prefill_refuses_bad_tables():
    query, k_cache, v_cache, tables, cu, lens = make_prefill_case([(5, 20)], 4, 2, 32)
    ops = cpu.compiled_ops()
    bad = tables.clone()
    bad[0, 1] = k_cache.shape[0]
    with pytest.raises(RuntimeError, match="block id out of range"):
        ops.prefill_attention(query, k_cache, v_cache, bad, cu, lens, 0.2)
    with pytest.raises(RuntimeError, match="context length out of range"):  # a chunk longer than its context
        ops.prefill_attention(query, k_cache, v_cache, tables, cu, torch.tensor([4], dtype=torch.int32), 0.2)
    with pytest.raises(RuntimeError, match="cu_seqlens_q"):
        ops.prefill_attention(query, k_cache, v_cache, tables, torch.tensor([0, 4], dtype=torch.int32), lens, 0.2)


@pytest.mark.parametrize("head_major", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_kv_store_matches_the_reference(head_major, dtype):
    """Both cache layouts, strided sources (slices of one qkv row, as the model passes them), padded slots."""
    g = torch.Generator().manual_seed(1)
    num_blocks, num_kv_heads, head_dim = 8, 3, 64
    if head_major:
        make = lambda: torch.zeros(num_kv_heads, num_blocks, BLOCK_SIZE, head_dim, dtype=dtype).permute(1, 2, 0, 3)
    else:
        make = lambda: torch.zeros(num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, dtype=dtype)
    qkv = torch.randn(5, 4 * num_kv_heads * head_dim, generator=g).to(dtype)
    key = qkv[:, num_kv_heads * head_dim:2 * num_kv_heads * head_dim].view(5, num_kv_heads, head_dim)
    value = qkv[:, 3 * num_kv_heads * head_dim:].view(5, num_kv_heads, head_dim)
    slots = torch.tensor([17, -1, 0, 127, 40])
    ours, theirs = (make(), make()), (make(), make())
    cpu.compiled_ops().store_kvcache(key, value, *ours, slots)
    reference.store_kvcache(key, value, *theirs, slots)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
        assert a.flatten(0, 1)[17].abs().sum() > 0 and a.flatten(0, 1)[1].abs().sum() == 0


def test_compiled_kv_store_refuses_a_slot_outside_the_cache_and_writes_nothing():
    k_cache, v_cache = torch.zeros(2, 4, BLOCK_SIZE, 8).permute(1, 2, 0, 3), torch.zeros(2, 4, BLOCK_SIZE, 8).permute(1, 2, 0, 3)
    key = value = torch.ones(2, 2, 8)
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu.compiled_ops().store_kvcache(key, value, k_cache, v_cache, torch.tensor([3, 4 * BLOCK_SIZE]))
    assert k_cache.abs().sum() == 0 and v_cache.abs().sum() == 0
