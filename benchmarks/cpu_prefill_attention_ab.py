"""Paired A/B of two versions of csrc/paged_attention.cpp's prefill op at the batch workload's prefill step: two
128-token prompts a step (whole prompts, causal), SmolLM2's heads (9 query, 3 KV, head size 64), the op called
once per layer for 30 layers' caches, as a step does. Each source is built under its own library name (headers
from its folder) and loaded in one process; their steps are interleaved, so both see the same machine. Not a test.

  git show main:backends/native_gpu/modelplex_native_gpu/kernels/csrc/paged_attention.cpp > /tmp/main.cpp
  flock /tmp/bench.lock .venv/bin/python benchmarks/cpu_prefill_attention_ab.py bf16 2 15 \\
      main=/tmp/main.cpp pattn=backends/native_gpu/modelplex_native_gpu/kernels/csrc/paged_attention.cpp

Prints per version the median and best ms per step and GFLOP/s (causal QK^T and PV), and the median of the
paired ratios.
"""
import statistics
import sys
import time

import torch
from cpu_decode_attention_ab import load

LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 30, 9, 3, 64, 16
PROMPTS, PROMPT_LEN = 2, 128


def main() -> None:
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[1]]
    threads, rounds = int(sys.argv[2]), int(sys.argv[3])
    versions = {spec.split("=")[0]: load(*spec.split("=")) for spec in sys.argv[4:]}
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    blocks_per_prompt = PROMPT_LEN // BLOCK
    num_blocks = PROMPTS * blocks_per_prompt + 1
    # head-major underneath, as the runner allocates it: [2, layers, blocks, block, KV heads, D]
    kv = torch.randn(2, LAYERS, KV_HEADS, num_blocks, BLOCK, HEAD_DIM, generator=g).to(dtype).permute(0, 1, 3, 4, 2, 5)
    tables = (torch.arange(PROMPTS * blocks_per_prompt, dtype=torch.int32) + 1).view(PROMPTS, blocks_per_prompt)
    cu = torch.arange(PROMPTS + 1, dtype=torch.int32) * PROMPT_LEN
    lens = torch.full((PROMPTS,), PROMPT_LEN, dtype=torch.int32)
    # q as the layer passes it: a strided view of the qkv projection's rows
    qkv = torch.randn(PROMPTS * PROMPT_LEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=g).to(dtype)
    q = qkv[:, :HEADS * HEAD_DIM].view(-1, HEADS, HEAD_DIM)

    def step(ops):
        for layer in range(LAYERS):
            ops.prefill_attention(q, kv[0, layer], kv[1, layer], tables, cu, lens, HEAD_DIM ** -0.5)

    times = {name: [] for name in versions}
    for ops in versions.values():
        step(ops)
    for _ in range(rounds):
        for name, ops in versions.items():
            t = time.perf_counter()
            step(ops)
            times[name].append(time.perf_counter() - t)
    pairs = PROMPTS * HEADS * PROMPT_LEN * (PROMPT_LEN + 1) // 2  # (query, key) pairs a layer
    flop = LAYERS * pairs * HEAD_DIM * 4
    first = next(iter(times))
    for name, ts in times.items():
        med, best = statistics.median(ts), min(ts)
        ratio = statistics.median(a / b for a, b in zip(times[first], ts))
        print(f"{sys.argv[1]} {threads} threads {name}: median {1e3 * med:.2f} ms a step ({flop / med / 1e9:.0f} "
              f"GFLOP/s), best {1e3 * best:.2f} ms, {first}/{name} paired median {ratio:.2f}")


if __name__ == "__main__":
    main()
