"""Where an engine step's time goes on the variable subset (the first 32 requests of llm_workloads'
variable workload: 19,961 prompt tokens, 8,241 greedy tokens, EOS ignored), and paired A/B throughput of two
checkouts on it. Not a test; llm_step_profile.py does the same on the fixed batch and lends its helpers.

  .venv/bin/python benchmarks/llm_variable_profile.py profile --dtype float32     # breakdown (markdown)
  flock /tmp/bench.lock .venv/bin/python benchmarks/llm_variable_profile.py ab --dtype float32 \\
      --trees /work/main,. --runs 3                                           # paired tok/s, A then B each round
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import llm_step_profile as P  # noqa: E402
import llm_workloads as W  # noqa: E402


def subset(num_requests: int) -> list[W.WorkItem]:
    return W.variable_workload(256)[:num_requests]


def worker(args) -> None:
    """Line protocol for `ab`: prints 'ready', then one tok/s figure per 'run' line read."""
    engine = P.make_engine(args.dtype, args.threads)
    items = subset(args.subset)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        with W.CpuLoad() as load:
            tok_s = P.run_once(engine, items)
        print(json.dumps({"tok_s": tok_s, "foreign_cores": load.foreign_cores}), flush=True)


def ab(args) -> None:
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    procs = []
    for tree in trees:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.join(tree, f)
                                                          for f in ("platform", "backends/native_gpu")))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker", "--dtype", args.dtype,
                                       "--threads", str(args.threads), "--subset", str(args.subset)],
                                      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    rounds = W.paired_rounds(procs, args.runs, args.quiet_s)
    print(f"\nvariable[:{args.subset}], {args.dtype}, {args.threads} threads; A={trees[0]} B={trees[1]}")
    print(f"A tok/s median {statistics.median(r[0] for r in rounds):.1f}, "
          f"B {statistics.median(r[1] for r in rounds):.1f}, B/A per round {[round(r[1] / r[0], 3) for r in rounds]}, "
          f"median {statistics.median(r[1] / r[0] for r in rounds):.3f}")


def profiled_run(engine, items) -> dict:
    """Per step kind: op self-time (ms per step) by part of the step, from one torch.profiler trace of the whole
    run (here prefill-carrying and decode-only steps interleave, so each op is assigned to the step around it)."""
    import bisect
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile, record_function

    P.add_workload(engine, items)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        while engine.has_unfinished_requests():
            with record_function("step:prefill" if P.has_prefill(engine) else "step:decode"):
                engine.step()
    events = prof.events()
    steps = sorted((e.time_range.start, e.time_range.end, e.name[5:]) for e in events if e.name.startswith("step:"))
    starts = [s[0] for s in steps]
    counts = defaultdict(int)
    for _, _, kind in steps:
        counts[kind] += 1
    parts = {k: defaultdict(float) for k in counts}
    ops = {k: defaultdict(lambda: [0.0, 0]) for k in counts}
    for e in events:
        if not e.name.startswith(("aten::", "modelplex_cpu::", "mkldnn::")):
            continue
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        if i < 0 or e.time_range.start > steps[i][1]:
            continue
        kind = steps[i][2]
        part = next((p for prefix, p in P.OP_PARTS if e.name == prefix), "other ops")
        parts[kind][part] += e.self_cpu_time_total / 1e3
        ops[kind][e.name][0] += e.self_cpu_time_total / 1e3
        ops[kind][e.name][1] += 1
    return {kind: {"steps": n, "parts": {p: ms / n for p, ms in parts[kind].items()},
                   "top_ops": sorted(((op, (ms / n, c / n)) for op, (ms, c) in ops[kind].items()),
                                     key=lambda kv: -kv[1][0])[:25]}
            for kind, n in counts.items()}


def profile(args) -> None:
    P.print_profile(P.make_engine(args.dtype, args.threads), subset(args.subset), args.dtype, args.quiet_s,
                    profiled_run)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["profile", "ab", "worker"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--subset", type=int, default=32, help="first requests of the variable workload")
    p.add_argument("--trees", default="", help="ab: two checkouts, A,B")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--quiet-s", type=float, default=20.0, help="before each timed run, wait up to this long "
                                                              "for other processes to use < 0.5 cores")
    args = p.parse_args()
    {"worker": worker, "ab": ab, "profile": profile}[args.mode](args)


if __name__ == "__main__":
    main()
