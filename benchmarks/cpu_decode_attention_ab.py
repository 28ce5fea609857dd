"""Paired A/B of two versions of csrc/paged_attention.cpp's decode op at cpu_decode_attention.py's shape (64
sequences x 192 tokens, SmolLM2's heads, 30 layers' caches in 1 GiB on huge pages): each source is built under
its own library name and loaded in one process, and their steps are interleaved, so both see the same machine.
`hot` maps every table into 8 blocks (K/V in cache: the op's compute alone). Not a test.

  git show main:backends/native_gpu/modelplex_native_gpu/kernels/csrc/paged_attention.cpp > /tmp/main.cpp
  flock /tmp/bench.lock .venv/bin/python benchmarks/cpu_decode_attention_ab.py fp32 2 15 \\
      main=/tmp/main.cpp attn=backends/native_gpu/modelplex_native_gpu/kernels/csrc/paged_attention.cpp [hot]

A version named `name=source@64` reads a cache of 64-token blocks (default 16; one cache per block size).

Prints per version the median and best ms per step and K/V GB/s, and the median of the paired ratios.
"""
import os
import statistics
import sys
import tempfile
import time

import torch
from cpu_decode_attention import BATCH, BLOCK, CONTEXT, HEAD_DIM, HEADS, KV_HEADS, LAYERS, make_cache
from torch.utils import cpp_extension

CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-ffp-contract=off"]
# headers (prefill_tiles.h) beside the source, else this checkout's (a source saved from git show to /tmp)
CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "backends", "native_gpu", "modelplex_native_gpu",
                    "kernels", "csrc")


def load(name: str, source: str):
    """The ops built from `source` under a library name of their own."""
    lib = "mpx_attention_ab_" + name
    path = os.path.join(tempfile.gettempdir(), lib + ".cpp")
    with open(source) as f, open(path, "w") as out:
        out.write(f.read().replace("modelplex_cpu", lib))
    cpp_extension.load(name=lib, sources=[path], is_python_module=False, extra_cflags=CFLAGS,
                       extra_ldflags=["-fopenmp"], extra_include_paths=[os.path.dirname(os.path.abspath(source)), CSRC])
    return getattr(torch.ops, lib)


def main() -> None:
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[1]]
    threads, rounds = int(sys.argv[2]), int(sys.argv[3])
    hot = sys.argv[-1] == "hot"
    specs = [spec.split("=") for spec in sys.argv[4:len(sys.argv) - hot]]  # name=source[@block size]
    torch.set_num_threads(threads)
    caches, builds, versions = {}, {}, {}
    for name, source in specs:
        source, _, block = source.partition("@")
        block = int(block or BLOCK)
        if block not in caches:
            caches[block] = make_cache(dtype, huge=True, hot=hot, block=block)
        if source not in builds:
            builds[source] = load(name, source)
        versions[name] = (builds[source], *caches[block])
    lens = torch.full((BATCH,), CONTEXT, dtype=torch.int32)
    q = torch.randn(BATCH, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0)).to(dtype)

    def step(ops, kv, tables):
        for layer in range(LAYERS):
            ops.paged_decode_attention(q, kv[0, layer], kv[1, layer], tables, lens, HEAD_DIM ** -0.5)

    times = {name: [] for name in versions}
    for version in versions.values():
        step(*version)
    for _ in range(rounds):
        for name, version in versions.items():
            t = time.perf_counter()
            step(*version)
            times[name].append(time.perf_counter() - t)
    kv_bytes = 2 * LAYERS * BATCH * CONTEXT * KV_HEADS * HEAD_DIM * dtype.itemsize
    first = next(iter(times))
    for name, ts in times.items():
        med, best = statistics.median(ts), min(ts)
        ratio = statistics.median(a / b for a, b in zip(times[first], ts))
        print(f"{sys.argv[1]} {threads} threads{' hot' if hot else ''} {name}: median {1e3 * med:.2f} ms a step "
              f"({kv_bytes / med / 1e9:.1f} GB/s), best {1e3 * best:.2f} ms ({kv_bytes / best / 1e9:.1f} GB/s), "
              f"{first}/{name} paired median {ratio:.2f}")


if __name__ == "__main__":
    main()
