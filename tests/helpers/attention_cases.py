"""Paged-attention cases in the CPU runner's cache layout and the decode and prefill checks against the torch
reference: shared by tests/native_gpu/test_cpu_attention.py and the other ISA builds it runs in child processes."""
import torch

from modelplex_native_gpu.kernels import reference

BLOCK_SIZE = 16
# bf16: K/V widened to fp32 as read, the fp32 kernels' arithmetic, one rounding of the output to bf16. Bound
# against float64 attention over the same bf16 inputs: half a bf16 ulp (rtol 2^-8 covers it) plus fp32 noise.
BF16_RTOL, BF16_ATOL = 2 ** -8, 1e-5
# SmolLM2-135M's 3 query heads per KV head (the AVX-512 passes); no GQA; a head size not a multiple of 8
# (the scalar path); one not a multiple of 32 (the 8-float tail); Llama-3's 4 query heads per KV head
DECODE_SHAPES = [(9, 3, 64), (4, 4, 32), (8, 2, 24), (6, 1, 80), (8, 2, 64)]
# 1: a single token; 16/17: at and across a block boundary; 100 and 203: many blocks, a partial tail
DECODE_LENS = [1, 16, 17, 100, 203]
# The same at 128-token blocks, vLLM's CPU default (one block, its end, across it, several with a partial tail)
BIG_BLOCK_SIZE = 128
BIG_DECODE_LENS = [1, 128, 129, 203, 600]


def make_case(batch, num_heads, num_kv_heads, head_dim, context_lens, dtype=torch.float32, num_blocks=64, seed=0,
              block_size=BLOCK_SIZE):
    """Caches in the CPU runner's head-major layout, shuffled disjoint block tables padded with the null block."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_kv_heads, num_blocks, block_size, head_dim)
    k_cache, v_cache = (torch.randn(shape, generator=g).to(dtype).permute(1, 2, 0, 3) for _ in range(2))
    max_blocks = max(-(-n // block_size) for n in context_lens) + 1  # one padded column
    ids = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    tables = []
    for n in context_lens:
        k = -(-n // block_size)
        tables.append([ids.pop() for _ in range(k)] + [0] * (max_blocks - k))
    query = torch.randn(batch, num_heads, head_dim, generator=g).to(dtype)
    return query, k_cache, v_cache, torch.tensor(tables, dtype=torch.int32), torch.tensor(context_lens, dtype=torch.int32)


def float64_case(case):
    return [t.double() if t.is_floating_point() else t for t in case]


def check_decode(ops, num_heads, num_kv_heads, head_dim, block_size=BLOCK_SIZE):
    """ops.paged_decode_attention against the reference: fp32 within 1e-5, bf16 within a rounding of float64."""
    lens = DECODE_LENS if block_size == BLOCK_SIZE else BIG_DECODE_LENS
    case = make_case(len(lens), num_heads, num_kv_heads, head_dim, lens, block_size=block_size)
    scale = head_dim ** -0.5
    got = ops.paged_decode_attention(*case, scale)
    torch.testing.assert_close(got, reference.paged_decode_attention(*case, scale), rtol=1e-5, atol=1e-5)
    case = make_case(len(lens), num_heads, num_kv_heads, head_dim, lens, dtype=torch.bfloat16, block_size=block_size)
    got = ops.paged_decode_attention(*case, scale)
    assert got.dtype == torch.bfloat16
    want = reference.paged_decode_attention(*float64_case(case), scale)
    torch.testing.assert_close(got.double(), want, rtol=BF16_RTOL, atol=BF16_ATOL)


def make_prefill_case(chunks, num_heads, num_kv_heads, head_dim, num_blocks=64, seed=1, block_size=BLOCK_SIZE):
    """`chunks`: (query tokens, context length) per sequence; a chunk is the last tokens of its context."""
    query, k_cache, v_cache, tables, lens = make_case(1, num_heads, num_kv_heads, head_dim, [c for _, c in chunks],
                                                      num_blocks=num_blocks, seed=seed, block_size=block_size)
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0] + torch.tensor([q for q, _ in chunks]).cumsum(0).tolist(), dtype=torch.int32)
    query = torch.randn(int(cu[-1]), num_heads, head_dim, generator=g)
    return query, k_cache, v_cache, tables, cu, lens


# Whole prompts (37, 16 at a block's end), chunks after a cached prefix (13 of 33, 24 crossing a block
# boundary), one token after a long prefix, and chunks longer than one task (8 or 16 query tokens).
PREFILL_CHUNKS = [(37, 37), (16, 16), (13, 33), (24, 40), (1, 101), (70, 90)]
# At 128-token blocks: a block's end, a chunk within a block after a prefix, chunks crossing one or two boundaries
BIG_PREFILL_CHUNKS = [(37, 37), (128, 128), (13, 100), (24, 140), (1, 301), (200, 330)]
# SmolLM2's; no GQA; head sizes not a multiple of 16 (24: of 8 either) and above 64 (80); Llama-3's group of 4
PREFILL_SHAPES = [(9, 3, 64), (4, 4, 32), (8, 2, 24), (6, 1, 80), (8, 2, 64)]


def check_prefill(ops, num_heads, num_kv_heads, head_dim, block_size=BLOCK_SIZE):
    """ops.prefill_attention against the reference: fp32 within 1e-5, bf16 within a rounding of float64."""
    chunks = PREFILL_CHUNKS if block_size == BLOCK_SIZE else BIG_PREFILL_CHUNKS
    case = make_prefill_case(chunks, num_heads, num_kv_heads, head_dim, block_size=block_size)
    scale = head_dim ** -0.5
    got = ops.prefill_attention(*case, scale)
    torch.testing.assert_close(got, reference.prefix_prefill_attention(*case, scale), rtol=1e-5, atol=1e-5)
    case = [case[0].bfloat16(), case[1].bfloat16(), case[2].bfloat16(), *case[3:]]
    got = ops.prefill_attention(*case, scale)
    assert got.dtype == torch.bfloat16
    want = reference.prefix_prefill_attention(*float64_case(case), scale)
    torch.testing.assert_close(got.double(), want, rtol=BF16_RTOL, atol=BF16_ATOL)
