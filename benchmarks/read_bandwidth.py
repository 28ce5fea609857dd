"""What a decode step could read at most, in this process on 2 threads: the copy bandwidth gguf_decode.py's bound
uses (read + write bytes of a 1 GiB fp32 copy) against a pure streaming read of the same bytes (torch.sum over
1 GiB: one add a float, memory-bound), which is what a decode step does with its weights.

Not a test. Example: flock /tmp/bench.lock .venv/bin/python benchmarks/read_bandwidth.py --rounds 5
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    a = torch.ones(1 << 28)
    b = torch.empty_like(a)
    nbytes = a.numel() * 4
    print("| round | copy GB/s (read + write) | read GB/s (sum) | read / copy |")
    print("| --- | --- | --- | --- |")
    for r in range(args.rounds):
        copy = 2 * nbytes / timed(lambda: b.copy_(a), 5) / 1e9
        read = nbytes / timed(lambda: a.sum(), 5) / 1e9
        print(f"| {r} | {copy:.1f} | {read:.1f} | {read / copy:.2f} |")


if __name__ == "__main__":
    main()
