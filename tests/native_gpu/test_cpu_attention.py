"""The CPU path's compiled paged attention (decode and prefill) vs the torch reference (the ops are built
on first use)."""
import os
import subprocess
import sys

import pytest
import torch
from helpers.attention_cases import (
    BIG_BLOCK_SIZE,
    BLOCK_SIZE,
    DECODE_SHAPES,
    PREFILL_CHUNKS,
    PREFILL_SHAPES,
    check_decode,
    check_prefill,
    make_case,
    make_prefill_case,
)

from modelplex_native_gpu.kernels import cpu, reference


@pytest.fixture(scope="module", autouse=True)
def compiled():
    if cpu.compiled_ops() is None:
        pytest.fail("the CPU decode-attention op did not build (gcc and ninja are installed by `make`)")


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", DECODE_SHAPES)
def test_decode_matches_reference(num_heads, num_kv_heads, head_dim):
    """fp32 within 1e-5 of the torch reference, bf16 within a rounding of float64 (helpers/attention_cases.py)."""
    check_decode(cpu.compiled_ops(), num_heads, num_kv_heads, head_dim)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", DECODE_SHAPES)
def test_decode_and_prefill_at_big_blocks_match_reference(num_heads, num_kv_heads, head_dim):
    """The same bounds at 128-token blocks: contexts and chunks within, at and across their boundaries."""
    check_decode(cpu.compiled_ops(), num_heads, num_kv_heads, head_dim, BIG_BLOCK_SIZE)
    check_prefill(cpu.compiled_ops(), num_heads, num_kv_heads, head_dim, BIG_BLOCK_SIZE)


# The AVX2 and portable builds of the ops (decode and prefill), alone in a child process (the op names would
# clash with the ones loaded here); the native build runs the same checks in the tests above.
OTHER_BUILD = """
import sys, torch
from torch.utils import cpp_extension
from helpers.attention_cases import BIG_BLOCK_SIZE, DECODE_SHAPES, PREFILL_SHAPES, check_decode, check_prefill
cpp_extension.load(name="modelplex_attention_" + sys.argv[1], sources=[sys.argv[2]], is_python_module=False,
                   extra_cflags=["-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off"] + sys.argv[3:])
for shape in DECODE_SHAPES:
    check_decode(torch.ops.modelplex_cpu, *shape)
    check_decode(torch.ops.modelplex_cpu, *shape, BIG_BLOCK_SIZE)
for shape in PREFILL_SHAPES:
    check_prefill(torch.ops.modelplex_cpu, *shape)
    check_prefill(torch.ops.modelplex_cpu, *shape, BIG_BLOCK_SIZE)
print("ok")
"""


@pytest.mark.parametrize("flags", [["-mno-avx512f"], ["-mno-avx512f", "-mno-avx2", "-mno-fma"]], ids=["avx2", "portable"])
def test_the_avx2_and_portable_decode_builds_match(flags):
    source = os.path.join(os.path.dirname(cpu.__file__), "csrc", "paged_attention.cpp")
    tag = "avx2" if len(flags) == 1 else "portable"
    tests = os.path.dirname(os.path.dirname(__file__))
    path = os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", OTHER_BUILD, tag, source, *flags],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": path})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


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


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", PREFILL_SHAPES)
def test_prefill_matches_reference(num_heads, num_kv_heads, head_dim):
    """fp32 within 1e-5 of the torch reference, bf16 within a rounding of float64; what the layer calls (kernels.cpu)
    is the op at both dtypes."""
    ops = cpu.compiled_ops()
    check_prefill(ops, num_heads, num_kv_heads, head_dim)
    case = make_prefill_case(PREFILL_CHUNKS, num_heads, num_kv_heads, head_dim)
    scale = head_dim ** -0.5
    assert torch.equal(cpu.prefix_prefill_attention(*case, scale), ops.prefill_attention(*case, scale))
    case = [case[0].bfloat16(), case[1].bfloat16(), case[2].bfloat16(), *case[3:]]
    assert torch.equal(cpu.prefix_prefill_attention(*case, scale), ops.prefill_attention(*case, scale))


def test_prefill_rows_do_not_depend_on_the_batch():
    """A chunk's rows come out the same alone or beside other sequences (tasks are claimed in any order)."""
    ops = cpu.compiled_ops()
    query, k_cache, v_cache, tables, cu, lens = make_prefill_case(PREFILL_CHUNKS, 9, 3, 64)
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = query.to(dtype), k_cache.to(dtype), v_cache.to(dtype)
        together = ops.prefill_attention(q, k, v, tables, cu, lens, 0.125)
        for s in range(len(lens)):
            rows = slice(int(cu[s]), int(cu[s + 1]))
            alone = ops.prefill_attention(q[rows], k, v, tables[s:s + 1], torch.tensor([0, rows.stop - rows.start],
                                          dtype=torch.int32), lens[s:s + 1], 0.125)
            assert torch.equal(alone, together[rows])


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
