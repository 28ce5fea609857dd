"""bf16 linear layers, kernel level: our vdpbf16ps panels (kernels/csrc/linear_bf16.cpp) vs oneDNN's packed
weights (torch.ops.mkldnn._linear_pointwise, what layers/linear.py ran before) and our fp32 panels.

Not a test. Example:
  flock /tmp/bench.lock .venv/bin/python benchmarks/linear_bf16.py --json benchmarks/results/linear_bf16.json
Per model shape, one decoder layer's four linears (qkv, o, gate_up, down) in a chain of --layers copies (more
bytes than the L3 cache, as a real step streams them), for M tokens; the SmolLM2 LM head alone. Each round
times every contender once per M in alternating order; the table gives medians over rounds of the time per
layer, and the per-round ratios oneDNN / ours. Both take and return bf16 (fp32 panels: fp32).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "backends", "native_gpu"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from gguf_decode import cpu_flags  # noqa: E402

# (out_features, in_features) of one layer's linears: qkv, o, gate_up, down
SHAPES = {
    "smollm2-135m": [(960, 576), (576, 576), (3072, 576), (576, 1536)],
    "llama-3.2-1b": [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)],
    "smollm2-lm_head": [(49152, 576)],
}


def contenders(ops, shapes: list[tuple[int, int]], copies: int) -> dict:
    """name -> (input dtype, a function of x running the chain of copies)."""
    g = torch.Generator().manual_seed(0)
    weights = [[torch.randn(n, k, generator=g).div_(k ** 0.5) for n, k in shapes] for _ in range(copies)]
    ours = [[(ops.pack_linear_weight_bf16(w), w.shape[0]) for w in layer] for layer in weights]
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w.bfloat16(), 64) for w in layer] for layer in weights]
    fp32 = [[(ops.pack_linear_weight(w), w.shape[0]) for w in layer] for layer in weights]
    del weights

    # x: in_features -> [M, in_features] input
    def run_ours(x):
        for layer in ours:
            for (packed, n), (_, k) in zip(layer, shapes):
                ops.packed_linear_bf16(x[k], packed, n, None)

    def run_onednn(x):
        for layer in onednn:
            for packed, (_, k) in zip(layer, shapes):
                torch.ops.mkldnn._linear_pointwise(x[k], packed, None, "none", [], "")

    def run_fp32(x):
        for layer in fp32:
            for (packed, n), (_, k) in zip(layer, shapes):
                ops.packed_linear(x[k], packed, n, None)

    return {"ours bf16": (torch.bfloat16, run_ours), "oneDNN bf16": (torch.bfloat16, run_onednn),
            "ours fp32": (torch.float32, run_fp32)}


def timed(fn, x, repeats: int) -> float:
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x)
        best.append(time.perf_counter() - t0)
    return min(best)


def measure(name: str, args, ops) -> dict:
    shapes = SHAPES[name]
    copies = 1 if name.endswith("lm_head") else max(1, int(args.chain_mb * 2**20 / (2 * sum(n * k for n, k in shapes))))
    runs = contenders(ops, shapes, copies)
    flops = 2 * sum(n * k for n, k in shapes)
    rows = {m: {c: [] for c in runs} for m in args.tokens}
    for r in range(args.rounds):
        for m in args.tokens:
            order = list(runs) if r % 2 == 0 else list(runs)[::-1]
            for c in order:
                dtype, fn = runs[c]
                x = {k: torch.randn(m, k, dtype=dtype) for _, k in shapes}
                fn(x)  # warm-up (oneDNN builds its kernel for this M)
                rows[m][c].append(timed(fn, x, args.repeats) / copies)
        print(f"  {name} round {r}: " + "; ".join(f"M={m} " + ", ".join(f"{c} {v[-1] * 1e6:.0f} us" for c, v in rows[m].items())
                                               for m in args.tokens), flush=True)
    return {"copies": copies, "flops_per_token": flops, "weight_bytes_bf16": 2 * sum(n * k for n, k in shapes),
            "us": {m: {c: [t * 1e6 for t in v] for c, v in rows[m].items()} for m in args.tokens}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,smollm2-lm_head,llama-3.2-1b")
    ap.add_argument("--tokens", default="1,8,64,256")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="runs of the chain per round; the fastest counts")
    ap.add_argument("--chain-mb", type=float, default=160, help="bf16 weight bytes of a chain: above the L3 cache")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    args.tokens = [int(t) for t in args.tokens.split(",")]
    torch.set_num_threads(args.threads)
    from modelplex_native_gpu.kernels import cpu

    ops = cpu.compiled_ops()
    assert ops is not None and hasattr(ops, "packed_linear_bf16"), "the compiled bf16 linear is not available here"
    print(f"CPU flags: {cpu_flags()}; torch {torch.__version__}; {args.threads} threads")
    results = {name: measure(name, args, ops) for name in args.models.split(",")}
    print("\nmicroseconds per layer (median of rounds); oneDNN / ours per round; bf16 weight GB/s and GFLOP/s of ours")
    print("| shape | M | ours bf16 us | oneDNN bf16 us | ours fp32 us | **oneDNN / ours** (rounds) | fp32 / bf16 | ours GB/s | ours GFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, res in results.items():
        for m in args.tokens:
            us = res["us"][m]
            med = {c: statistics.median(v) for c, v in us.items()}
            ratios = [o / b for o, b in zip(us["oneDNN bf16"], us["ours bf16"])]
            print(f"| {name} | {m} | {med['ours bf16']:.1f} | {med['oneDNN bf16']:.1f} | {med['ours fp32']:.1f} | "
                  f"**{statistics.median(ratios):.2f}** ({', '.join(f'{x:.2f}' for x in ratios)}) | "
                  f"{med['ours fp32'] / med['ours bf16']:.2f} | {res['weight_bytes_bf16'] / med['ours bf16'] / 1e3:.1f} | "
                  f"{res['flops_per_token'] * m / med['ours bf16'] / 1e3:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu_flags": cpu_flags(), "args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
