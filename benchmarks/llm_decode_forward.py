"""The model's forward on one 64-sequence decode step of the peers' fixed batch (--workload variable: the variable
subset's first decode-only step, ~29 sequences of context lengths ~100 to ~1.6k), repeated: paired medians of two
checkouts (the decode step's compute alone, without the run's prefill steps and host phases). Not a test.

  flock /tmp/bench.lock .venv/bin/python benchmarks/llm_decode_forward.py --dtype float32 --trees /work/main,. \\
      --reps 150 --rounds 2

Each round runs one child process per checkout (its own PYTHONPATH, so its own compiled kernels), A then B: the
workload steps until every sequence decodes (and 20 steps more), one step's forward arguments are captured, then
that forward runs --reps times (the same K/V slots rewritten with the same values).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(dtype: str, reps: int, workload: str) -> None:
    import torch

    sys.path.insert(0, HERE)
    import llm_step_profile as P
    import llm_workloads as W

    engine = P.make_engine(dtype, 2)
    model, captured = engine.runner.model, []
    forward = model.forward

    def capture(*args):
        captured.append(args)
        return forward(*args)

    def captured_step():
        captured.clear()
        model.forward = capture
        engine.step()
        del model.forward
        return captured[0]

    if workload == "fixed":
        P.add_workload(engine, W.peer_workload())
        while P.has_prefill(engine):
            engine.step()
        for _ in range(20):
            engine.step()
        args = captured_step()
    else:  # the variable subset: its first decode-only step (every admitted prompt prefilled, the rest waiting)
        P.add_workload(engine, W.variable_workload()[:32])
        args = captured_step()
        while args[2][0].num_decode_tokens < args[0].shape[0]:
            args = captured_step()
    times = []
    with torch.inference_mode():
        for _ in range(reps):
            t0 = time.perf_counter()
            model.forward(*args)
            times.append(1e3 * (time.perf_counter() - t0))
    print(f"{args[2][0].num_decode_tokens} {statistics.median(times):.3f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--trees", default="", help="two checkouts, A,B")
    p.add_argument("--reps", type=int, default=150)
    p.add_argument("--workload", default="fixed", choices=["fixed", "variable"],
                   help="the peers' fixed batch, or the variable subset (first 32 requests; lengths differ)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.dtype, args.reps, args.workload)
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    rounds = []
    for r in range(args.rounds):
        row = []
        for tree in trees:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.join(tree, f) for f in ("platform",
                                                                                          "backends/native_gpu")))
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--dtype", args.dtype,
                                  "--reps", str(args.reps), "--workload", args.workload], env=env,
                                 capture_output=True, text=True, check=True)
            rows, ms = out.stdout.split()[-2:]
            row.append(float(ms))
        rounds.append(row)
        print(f"round {r + 1}: {rows} rows, forward median {row[0]:.2f}, {row[1]:.2f} ms, B/A {row[1] / row[0]:.3f}",
              flush=True)
    print(f"\n{args.dtype} {args.workload}; A={trees[0]} B={trees[1]}: "
          f"B/A per round {[round(b / a, 3) for a, b in rounds]}, "
          f"median {statistics.median(b / a for a, b in rounds):.3f}")


if __name__ == "__main__":
    main()
