"""The CPU paged decode-attention op alone at the batch workload's decode shape: 64 sequences x 192 tokens,
SmolLM2's heads (9 query, 3 KV, head size 64), 30 layers' caches in 1 GiB, the op called once per layer as a
step does. Blocks are laid out as the engine hands them out (a prompt's blocks together, decode blocks
interleaved across sequences). Not a test.

  flock /tmp/bench.lock .venv/bin/python benchmarks/cpu_decode_attention.py fp32 huge    # or bf16, small

`huge`: the cache advised MADV_HUGEPAGE before first touch (as engine/huge_pages.py does); `small`: 4 KiB pages.
Prints the median ms per step over 15 steps and the K/V read rate.
"""
import ctypes
import statistics
import sys
import time

import torch

from modelplex_native_gpu.kernels import cpu

LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 30, 9, 3, 64, 16
BATCH, CONTEXT, PROMPT_BLOCKS = 64, 192, 8


def make_cache(dtype: torch.dtype, huge: bool, hot: bool = False, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """30 layers' K/V caches in 1 GiB ([2, layers, blocks, block, KV heads, D], head-major underneath) and the
    64 block tables for `block`-token blocks (the prompt's PROMPT_BLOCKS * BLOCK tokens in whole blocks, the
    rest one decode block at a time); `hot` maps every table into 8 blocks (K/V stay in cache: compute alone)."""
    num_blocks = (1 << 30) // (2 * LAYERS * KV_HEADS * block * HEAD_DIM * dtype.itemsize)
    buf = torch.empty(2 * LAYERS * KV_HEADS * num_blocks * block * HEAD_DIM, dtype=dtype)
    if huge:
        start, size, page = buf.data_ptr(), buf.numel() * buf.element_size(), 2 << 20
        first, end = -(-start // page) * page, (start + size) // page * page
        ctypes.CDLL("libc.so.6").madvise(ctypes.c_void_p(first), ctypes.c_size_t(end - first), 14)  # MADV_HUGEPAGE
    buf.normal_()
    kv = buf.view(2, LAYERS, KV_HEADS, num_blocks, block, HEAD_DIM).permute(0, 1, 3, 4, 2, 5)
    prompt_blocks, total_blocks = PROMPT_BLOCKS * BLOCK // block, -(-CONTEXT // block)
    tables = torch.zeros(BATCH, total_blocks, dtype=torch.int32)
    ids = iter(range(1, num_blocks))  # a prompt's blocks together, decode blocks interleaved across sequences
    for b in range(BATCH):
        for i in range(prompt_blocks):
            tables[b, i] = next(ids)
    for i in range(prompt_blocks, total_blocks):
        for b in range(BATCH):
            tables[b, i] = next(ids)
    return kv, tables % 8 + 1 if hot else tables


def main() -> None:
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[1]]
    torch.set_num_threads(2)
    ops = cpu.compiled_ops()
    kv, tables = make_cache(dtype, sys.argv[2] == "huge")
    lens = torch.full((BATCH,), CONTEXT, dtype=torch.int32)
    q = torch.randn(BATCH, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0)).to(dtype)

    def step():
        for layer in range(LAYERS):
            ops.paged_decode_attention(q, kv[0, layer], kv[1, layer], tables, lens, HEAD_DIM ** -0.5)

    for _ in range(3):
        step()
    times = []
    for _ in range(15):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    kv_bytes = 2 * LAYERS * BATCH * CONTEXT * KV_HEADS * HEAD_DIM * dtype.itemsize
    print(f"{sys.argv[1]} {sys.argv[2]}: {1e3 * median:.2f} ms per step (30 layers), {kv_bytes / median / 1e9:.1f} GB/s of K/V")


if __name__ == "__main__":
    main()
