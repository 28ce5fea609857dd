"""Kernel times of the linear layers on GGUF-quantized weights at SmolLM2-135M's shapes: quant_linear.cpp's
kernels (integer tiles; K-quants a row tile dequantized then dot products), quant_gemm.cpp's batched form,
and the fp32 packed linear (linear.cpp) on the same weights dequantized, per type and batch size (K-quants
with K = 768 where SmolLM2 has 576, which is no whole number of their 256-weight super-blocks). Where the build
repacks a type at load (quant_repacked_type: Q4_0, Q4_1, Q8_0 in 16-row groups, quant_repack.cpp), a second
table gives quant_linear on the repacked weights ("x16") against the others.

Not a test. Sets MODELPLEX_QUANT_GEMM_MIN_TOKENS so that quant_linear keeps its own kernels at every size (the
quant_gemm op is called directly), and prints the batch size from which each type would switch.
  flock /tmp/bench.lock .venv/bin/python benchmarks/quant_gemm.py --threads 1 --rounds 3 --out results/quant_gemm.md
Each cell: per round the best of 7 x (up to) 10 calls, then the median over rounds (rounds interleave the kernels).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "backends", "native_gpu"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
os.environ["MODELPLEX_QUANT_GEMM_MIN_TOKENS"] = str(1 << 40)  # read once, at the first quantized call

import llm_workloads as W  # noqa: E402

TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K")
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}  # (N, K)
# K-quants' rows are 256-weight super-blocks: 576 is none (llama.cpp stores such tensors in other types)
K_SHAPES = {"qkv": (960, 768), "o": (576, 768), "gate_up": (3072, 768), "down": (576, 1536)}


def best_us(fn, repeats=7) -> float:
    """Best of `repeats` timings of up to 10 calls (fewer where a call takes over 2 ms), microseconds a call."""
    t0 = time.perf_counter()
    fn()
    calls = max(1, min(10, int(0.02 / (time.perf_counter() - t0))))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", default="1,8,16,64,200")
    p.add_argument("--types", default=",".join(TYPES))
    p.add_argument("--out", default=None, help="markdown table here")
    args = p.parse_args()
    import gguf
    import torch
    from helpers.quant_check import dequantize, make_weight

    from modelplex_native_gpu.kernels import cpu

    torch.set_num_threads(args.threads)
    ops = cpu.compiled_ops()
    tokens = [int(t) for t in args.tokens.split(",")]
    cases = []  # (type, shape, m, callables)
    repacked = {}  # type -> shape -> the weight in quant_repacked_type's layout
    for type_name in args.types.split(","):
        qtype = int(gguf.GGMLQuantizationType[type_name])
        for shape, (n, k) in (K_SHAPES if type_name.endswith("_K") else SHAPES).items():
            data = torch.from_numpy(make_weight(type_name, n, k, seed=n + k))
            packed = ops.pack_linear_weight(torch.from_numpy(dequantize(type_name, data.numpy(), k).copy()))
            repacked_type = ops.quant_repacked_type(qtype)
            if repacked_type != qtype:
                copy = data.clone()
                ops.quant_repack_(copy, qtype, repacked_type)
                repacked.setdefault(type_name, {})[shape] = copy
            for m in tokens:
                x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
                fns = {"quant_linear": lambda x=x, d=data, q=qtype: ops.quant_linear(x, d, q, None),
                       "quant_gemm": lambda x=x, d=data, q=qtype: ops.quant_gemm(x, d, q, None),
                       "fp32": lambda x=x, w=packed, n=n: ops.packed_linear(x, w, n, None)}
                if type_name in repacked:
                    fns["x16"] = lambda x=x, d=repacked[type_name][shape], q=repacked_type: ops.quant_linear(x, d, q, None)
                cases.append((type_name, shape, m, fns))
    times = {(c[0], c[1], c[2], name): [] for c in cases for name in c[3]}
    for r in range(args.rounds):
        for type_name, shape, m, fns in cases:
            for name, fn in fns.items():
                times[(type_name, shape, m, name)].append(best_us(fn))
        print(f"round {r + 1} done", flush=True)
    med = {key: statistics.median(v) for key, v in times.items()}
    lines = [f"CPU: {W.cpu_model()}; {args.threads} thread(s); load average at end {os.getloadavg()[0]:.2f}; "
             f"median over {args.rounds} rounds of the best of 7 x (up to) 10 calls, microseconds a call.", "",
             "| type | m | " + " | ".join(f"{s} int / gemm / fp32" for s in SHAPES) +
             " | all four: int / gemm / fp32 | gemm / fp32 | int / gemm |",
             "|---|---|" + "---|" * (len(SHAPES) + 3)]
    for type_name in args.types.split(","):
        for m in tokens:
            cells, sums = [], {"quant_linear": 0.0, "quant_gemm": 0.0, "fp32": 0.0}
            for shape in SHAPES:
                t = {name: med[(type_name, shape, m, name)] for name in sums}
                for name in sums:
                    sums[name] += t[name]
                cells.append(f"{t['quant_linear']:.0f} / {t['quant_gemm']:.0f} / {t['fp32']:.0f}")
            lines.append(f"| {type_name} | {m} | " + " | ".join(cells) +
                         f" | {sums['quant_linear']:.0f} / {sums['quant_gemm']:.0f} / {sums['fp32']:.0f} "
                         f"| {sums['quant_gemm'] / sums['fp32']:.2f} | {sums['quant_linear'] / sums['quant_gemm']:.2f} |")
    if repacked:
        lines += ["", "| type | m | " + " | ".join(f"{s} x16" for s in SHAPES) +
                  " | all four: x16 | x16 / int | x16 / gemm | x16 / fp32 |", "|---|---|" + "---|" * (len(SHAPES) + 4)]
        for type_name in repacked:
            for m in tokens:
                t = {name: sum(med[(type_name, s, m, name)] for s in SHAPES)
                     for name in ("x16", "quant_linear", "quant_gemm", "fp32")}
                lines.append(f"| {type_name}x16 | {m} | " + " | ".join(f"{med[(type_name, s, m, 'x16')]:.0f}" for s in SHAPES) +
                             f" | {t['x16']:.0f} | {t['x16'] / t['quant_linear']:.2f} | {t['x16'] / t['quant_gemm']:.2f} "
                             f"| {t['x16'] / t['fp32']:.2f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
