"""The Triton matmul on GGUF-quantized weights (kernels/triton_quant.py) vs torch's bf16 matmul on the same
weights dequantized, on one CUDA device: Llama-3.2-1B's and Llama-3.1-8B's linear shapes, decode and
prefill token counts, per type.

Not a test. Example (on a CUDA machine):
  .venv/bin/python benchmarks/triton_quant_matmul.py --types Q8_0 Q4_0 Q4_K Q6_K --tokens 1 16 128 2048
Per shape and token count: the median of --rounds timings (CUDA events around --iters calls each) of the
kernel and of torch.matmul on bf16 weights, their ratio, and the kernel's weight bytes read per second
(decode is bound by them). Random codes with sane scales (helpers/quant_check.make_weight): the values do
not change the work. `--interpret` runs tiny shapes under TRITON_INTERPRET=1 on CPU to check the script.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "backends", "native_gpu"), os.path.join(ROOT, "tests")]

# (name, out_features, in_features) per model: fused q/k/v, o, fused gate/up, down
SHAPES = {"llama-3.2-1b": [("qkv", 3072, 2048), ("o", 2048, 2048), ("gate_up", 16384, 2048), ("down", 2048, 8192)],
          "llama-3.1-8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]}
TINY = {"tiny": [("qkv", 96, 256), ("down", 64, 512)]}


def timed(fn, iters: int, rounds: int, device) -> float:
    """Median microseconds a call over `rounds` of `iters` calls."""
    import time

    import torch

    fn()
    samples = []
    for _ in range(rounds):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / iters)
        else:
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            samples.append((time.perf_counter() - t) * 1e6 / iters)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", nargs="+", default=["Q8_0", "Q4_0", "Q4_K", "Q6_K"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 16, 128, 2048])
    parser.add_argument("--models", nargs="+", default=list(SHAPES))
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interpret", action="store_true", help="tiny shapes on CPU under TRITON_INTERPRET=1")
    parser.add_argument("--tiles", default="", metavar="M,N,K,WARPS",
                        help="one tile shape for every token count instead of the kernel's own choice (_tiles)")
    args = parser.parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel module is imported
    import gguf
    import torch
    from helpers.quant_check import make_weight

    from modelplex_native_gpu.kernels import quant_layout, triton_quant
    from modelplex_native_gpu.kernels.triton_quant import quant_matmul

    if args.tiles:
        tiles = tuple(int(v) for v in args.tiles.split(","))
        triton_quant._tiles = lambda m: tiles

    if not args.interpret and not torch.cuda.is_available():
        print("needs a CUDA device (or --interpret for a CPU smoke run)")
        return 2
    device = torch.device("cpu" if args.interpret else "cuda")
    shapes = TINY if args.interpret else {m: SHAPES[m] for m in args.models}
    tokens = [1, 17] if args.interpret else args.tokens
    iters, rounds = (1, 1) if args.interpret else (args.iters, args.rounds)
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu (interpreted)'}")
    print("| model | linear | type | tokens | triton us | bf16 matmul us | ratio | weight GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    for model, linears in shapes.items():
        for name, n, k in linears:
            for type_name in args.types:
                data = torch.from_numpy(make_weight(type_name, n, k, seed=n + k))
                planes = quant_layout.split_planes(data, int(gguf.GGMLQuantizationType[type_name]), k)
                planes = planes.map(lambda t: t.to(device))
                w = quant_layout.dequantize(planes).to(torch.bfloat16)
                nbytes = sum(t.numel() * t.element_size() for t in planes.tensors())
                for m in tokens:
                    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                    ours = timed(lambda x=x, p=planes: quant_matmul(x, p), iters, rounds, device)
                    dense = timed(lambda x=x, w=w: torch.matmul(x, w.T), iters, rounds, device)
                    print(f"| {model} | {name} {n}x{k} | {type_name} | {m} | {ours:.1f} | {dense:.1f} | "
                          f"{dense / ours:.2f} | {nbytes / ours / 1e3:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
