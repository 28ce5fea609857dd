"""Workloads and measurement helpers for benchmarks/llm_offline.py (deterministic, no model needed)."""
from __future__ import annotations

import json
import os
import random
import statistics
import time
from dataclasses import dataclass

PEER_PROMPTS = os.environ.get("PEER_PROMPTS", "/work/shared/bench/peers/prompts.json")


@dataclass
class WorkItem:
    prompt_ids: list[int]
    max_tokens: int


def variable_workload(num_requests=256, min_prompt=32, max_prompt=1024, min_output=16, max_output=512,
                      system_len=512, shared_fraction=0.25, seed=0, token_range=(300, 40000)) -> list[WorkItem]:
    """Prompt and output lengths drawn uniformly; every 1/shared_fraction-th request starts with one shared
    `system_len`-token system prompt (so a quarter share it by default)."""
    rng = random.Random(seed)
    system = [rng.randrange(*token_range) for _ in range(system_len)]
    every = round(1 / shared_fraction) if shared_fraction else 0
    items = []
    for i in range(num_requests):
        shared = every and i % every == 0
        low = max(min_prompt, system_len + 16) if shared else min_prompt
        length = rng.randint(low, max(low, max_prompt))
        head = system if shared else []
        ids = head + [rng.randrange(*token_range) for _ in range(length - len(head))]
        items.append(WorkItem(ids, rng.randint(min_output, max_output)))
    return items


def peer_workload(num_prompts=64, prompt_tokens=128, gen_tokens=128, path=PEER_PROMPTS) -> list[WorkItem]:
    """The peers' fixed workload: 64 prompts of 128 token ids, 128 greedy tokens each (EOS ignored)."""
    with open(path) as f:
        prompts = json.load(f)["prompts"]
    return [WorkItem(p["ids"][:prompt_tokens], gen_tokens) for p in prompts[:num_prompts]]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "runs": values}


def measure_bandwidth(num_bytes=512 << 20, repeats=5) -> float:
    """Best copy rate in bytes/s, read + write counted (the peers' machine_limits copy figure)."""
    import torch

    src = torch.ones(num_bytes // 4)
    dst = torch.empty_like(src)
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = max(best, 2 * num_bytes / (time.perf_counter() - t))
    return best


class CpuLoad:
    """Cores used by other processes during a block (from /proc/stat minus this process)."""

    def __enter__(self):
        self.t0, self.busy0, self.mine0 = time.perf_counter(), _busy_seconds(), time.process_time()
        return self

    def __exit__(self, *exc):
        dt = max(time.perf_counter() - self.t0, 1e-6)
        self.foreign_cores = max(0.0, (_busy_seconds() - self.busy0 - (time.process_time() - self.mine0)) / dt)


def _busy_seconds() -> float:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)) / os.sysconf("SC_CLK_TCK")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return "unknown"
    name = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")), "unknown")
    flags = next((x.split(":", 1)[1].split() for x in lines if x.startswith("flags")), [])
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16")
           if f in flags]
    amx = "" if "amx_bf16" in flags else ", no AMX"
    return f"{name} ({os.cpu_count()} cores; {' '.join(isa) or 'no AVX2'}{amx})"


def wait_quiet(max_foreign_cores: float = 0.5, timeout_s: float = 120.0, window_s: float = 2.0) -> float:
    """Wait (up to timeout_s) for a window in which other processes use < max_foreign_cores; returns the
    last window's foreign load, so a run on a machine that never quietened is visible in the results."""
    deadline = time.monotonic() + timeout_s
    while True:
        with CpuLoad() as load:
            time.sleep(window_s)
        if load.foreign_cores < max_foreign_cores or time.monotonic() > deadline:
            return load.foreign_cores


def paired_rounds(procs, runs: int, quiet_s: float) -> list[list[float]]:
    """A/B worker processes (one tree each) that print "ready" once built and answer each "run" line with one
    run's JSON: `runs` rounds, every worker once a round in turn after a quiet window, each round printed with
    its B/A and foreign load; the workers are closed at the end. Returns each round's tok/s, one per worker."""
    for p in procs:
        while p.stdout.readline().strip() != "ready":
            if p.poll() is not None:
                raise SystemExit("a worker failed to start")
    rounds = []
    for r in range(runs):
        row = []
        for p in procs:
            wait_quiet(timeout_s=quiet_s)
            p.stdin.write("run\n")
            p.stdin.flush()
            row.append(json.loads(p.stdout.readline()))
        rounds.append([x["tok_s"] for x in row])
        print(f"round {r + 1}: " + ", ".join(f"{x['tok_s']:.1f}" for x in row)
              + f" tok/s, B/A {row[1]['tok_s'] / row[0]['tok_s']:.3f}, foreign cores "
              + ", ".join(f"{x['foreign_cores']:.2f}" for x in row), flush=True)
    for p in procs:
        p.stdin.close()
        p.wait()
    return rounds
