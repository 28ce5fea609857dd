"""The loop every peer runner shares: load once, then time one whole workload per "run" line on stdin.

A runner is started by benchmarks/llm_offline.py inside the peer's own venv:
  <venv>/bin/python benchmarks/llm_peers/<peer>.py --workload W.json [--dtype float32] [--threads 2]
It prints one JSON line "ready" after loading, then one JSON result line per "run" it reads, so the
orchestrator can interleave the engines round by round. Stdlib only (plus the peer's own package).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable

_BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _BENCHMARKS)
from llm_workloads import CpuLoad  # noqa: E402  (stdlib-only helpers)
sys.path.remove(_BENCHMARKS)  # it holds scripts named like the peers' packages (benchmarks/openvino.py)


def parse_args(extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", required=True, help="JSON: {requests: [{prompt_ids, max_tokens}], ...}")
    p.add_argument("--model", required=True, help="the peer's model path (HF folder, GGUF or ORT folder)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    if extra:
        extra(p)
    return p.parse_args()


def load_requests(path: str) -> list[dict]:
    with open(path) as f:
        return json.load(f)["requests"]


def serve(info: dict, run_batch: Callable[[list[dict]], int], requests: list[dict]) -> None:
    """run_batch(requests) -> generated tokens; answers each "run" line with throughput, the CPU time this
    process spent per generated token (the figure least moved by other tenants' load) and foreign load."""
    print(json.dumps({"ready": True, **info}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        with CpuLoad() as load:
            t0, cpu0 = time.perf_counter(), time.process_time()
            generated = run_batch(requests)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        print(json.dumps({"generated_tokens": generated, "wall_s": wall, "tok_s": generated / wall,
                          "cpu_ms_per_token": 1e3 * cpu / generated, "foreign_cores": load.foreign_cores}),
              flush=True)
