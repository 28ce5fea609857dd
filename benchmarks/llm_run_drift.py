"""Run-to-run drift of the native engine (issue 23): one workload run N times in one process, each run with
the step time split and the state that could carry over from earlier runs. Not a test.

  flock /tmp/bench.lock .venv/bin/python benchmarks/llm_run_drift.py --runs 5            # one process, 5 runs
  flock /tmp/bench.lock .venv/bin/python benchmarks/llm_run_drift.py --runs 1 --fresh 3  # 3 processes, 1 run each
  ... --workload variable    # llm_offline's variable workload (256 requests) instead of the fixed batch

Per run: generated tok/s, decode-only steps (count, ms per step, of which decode attention), steps with prefill
tokens, the share of steps the thread governor ran on fewer threads, where each sequence's KV blocks lie (at the
last decode step of the full batch: contiguous ascending runs per table, distinct 2 MiB spans), prefix-cache
entries kept from earlier runs, RSS and the foreign load. Each run uses its own cache salt, as llm_offline does.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "backends", "native_gpu"))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import llm_workloads as W  # noqa: E402

BLOCKS_PER_2MIB = 512  # fp32, 64 dims, 16 tokens: a 4 KiB block per (layer, KV head) region


def make_engine(args):
    import torch

    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine
    from modelplex_native_gpu.loader import load_weights

    torch.set_num_threads(args.threads)
    from llm_offline import default_model

    model = default_model()
    config = EngineConfig(model=model, dtype=args.dtype, quantized_weights=False, device="cpu", max_model_len=2048,
                          kv_cache_memory_bytes=1 << 30, max_num_seqs=256, num_threads=args.threads,
                          skip_tokenizer_init=True, adaptive_threads=not args.fixed_threads)
    engine = LLMEngine(config, loaded=load_weights(model))
    engine.generate([[1, 2, 3, 4]])  # warm-up
    return engine


def block_layout(tables: list[list[int]]) -> dict:
    """Per table: contiguous ascending runs (1 = one extent), distinct 2 MiB spans of a (layer, head) region."""
    runs = [1 + sum(b != a + 1 for a, b in zip(t, t[1:])) for t in tables if t]
    spans = [len({b // BLOCKS_PER_2MIB for b in t}) for t in tables if t]
    descending = sum(b == a - 1 for t in tables for a, b in zip(t, t[1:]))
    pairs = sum(max(0, len(t) - 1) for t in tables)
    return {"extents_per_seq": statistics.mean(runs), "spans_2mib_per_seq": statistics.mean(spans),
            "descending_pair_share": descending / pairs if pairs else 0.0}


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def huge_mib() -> float:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("AnonHugePages")) / 1024


def attention_ab(engine, batches: list[tuple], reps: int) -> list[float]:
    """Decode attention over all layers' caches with each run's captured (query, block_tables, context_lens) of the
    full batch, interleaved rep by rep; median ms per step (30 layers) for each run's tables."""
    from modelplex_native_gpu.kernels import cpu

    attn = [layer.self_attn.attn for layer in engine.runner.model.layers]
    times = [[] for _ in batches]
    for _ in range(reps):
        for i, (query, tables, lens) in enumerate(batches):
            start = time.perf_counter()
            for a in attn:
                cpu.paged_decode_attention(query, a.k_cache, a.v_cache, tables, lens, a.scale)
            times[i].append(1e3 * (time.perf_counter() - start))
    return [statistics.median(t) for t in times]


def run_once(engine, items) -> dict:
    from modelplex_native_gpu.engine.sampling_params import SamplingParams
    from modelplex_native_gpu.kernels import cpu

    kv, governor = engine.kv_cache_manager, engine.thread_governor
    attention_s, captured = [0.0], [None]
    original = cpu.paged_decode_attention

    def timed_attention(*a, **k):
        if a[3].shape[0] >= min(len(items), 64):
            captured[0] = (a[0].clone(), a[3].clone(), a[4].clone())
        start = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            attention_s[0] += time.perf_counter() - start

    cpu.paged_decode_attention = timed_attention
    cached_before = len(kv.block_pool.cached_blocks)
    salt = f"run-{time.monotonic_ns()}"
    for i, item in enumerate(items):
        engine.add_request(f"r{i}", item.prompt_ids, SamplingParams(temperature=0, max_tokens=item.max_tokens,
                                                                    ignore_eos=True), cache_salt=salt,
                           detokenize=False)
    steps = {"prefill": [0, 0.0], "decode": [0, 0.0]}
    decode_attention_s, fewer_threads, generated, layout = 0.0, 0, 0, None
    t0 = time.perf_counter()
    with W.CpuLoad() as load:
        while engine.has_unfinished_requests():
            s = engine.scheduler
            kind = "prefill" if s.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in s.running) \
                else "decode"
            if kind == "decode" and len(s.running) >= min(len(items), 64):
                layout = [kv.block_table(r.request_id) for r in s.running]
            attention_s[0], start = 0.0, time.perf_counter()
            generated += sum(len(out.new_token_ids) for out in engine.step())
            steps[kind][0] += 1
            steps[kind][1] += time.perf_counter() - start
            if kind == "decode":
                decode_attention_s += attention_s[0]
            if governor is not None and governor.num_threads < governor.max_threads:
                fewer_threads += 1
    wall = time.perf_counter() - t0
    cpu.paged_decode_attention = original
    nd, np_ = steps["decode"][0], steps["prefill"][0]
    return {"tok_s": generated / wall, "wall_s": wall, "decode_steps": nd,
            "decode_step_ms": 1e3 * steps["decode"][1] / max(nd, 1),
            "decode_attention_ms": 1e3 * decode_attention_s / max(nd, 1),
            "decode_other_ms": 1e3 * (steps["decode"][1] - decode_attention_s) / max(nd, 1),
            "prefill_steps": np_, "prefill_step_ms": 1e3 * steps["prefill"][1] / max(np_, 1),
            "fewer_threads_share": fewer_threads / max(nd + np_, 1),
            **(block_layout(layout) if layout else {}),
            "cached_blocks_before": cached_before, "rss_mib": rss_mib(), "huge_mib": huge_mib(), "gc_objects": len(gc.get_objects()),
            "foreign_cores": load.foreign_cores, "_batch": captured[0]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="runs in this process")
    p.add_argument("--fresh", type=int, default=0, help="instead: this many processes, each doing --runs runs")
    p.add_argument("--workload", default="fixed", choices=["fixed", "variable"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quiet-s", type=float, default=20.0)
    p.add_argument("--fixed-threads", action="store_true", help="thread governor off (always --threads)")
    p.add_argument("--ab-reps", type=int, default=0,
                   help="then time decode attention on each run's captured block tables, this many reps")
    p.add_argument("--out", default=None, help="append one JSON line per process here")
    args = p.parse_args()
    if args.fresh:
        for _ in range(args.fresh):
            cmd = [sys.executable, os.path.abspath(__file__), "--runs", str(args.runs), "--workload", args.workload,
                   "--dtype", args.dtype, "--threads", str(args.threads), "--quiet-s", str(args.quiet_s)] + (["--fixed-threads"] if args.fixed_threads else [])
            subprocess.run(cmd + (["--out", args.out] if args.out else []), check=True)
        return
    engine = make_engine(args)
    items = W.peer_workload() if args.workload == "fixed" else W.variable_workload()
    results, batches = [], []
    for r in range(args.runs):
        W.wait_quiet(timeout_s=args.quiet_s)
        res = run_once(engine, items)
        batches.append(res.pop("_batch"))
        results.append(res)
        print(f"[run {r + 1}] " + json.dumps({k: round(v, 3) for k, v in res.items()}), flush=True)
    ab = None
    if args.ab_reps and all(b is not None for b in batches):
        W.wait_quiet(timeout_s=args.quiet_s)
        ab = attention_ab(engine, batches, args.ab_reps)
        print("decode attention ms per step (30 layers) on each run's block tables:", [round(x, 2) for x in ab])
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps({"workload": args.workload, "dtype": args.dtype, "pid": os.getpid(),
                                "cpu": W.cpu_model(),
                                "fixed_threads": args.fixed_threads, "runs": results, "attention_ab_ms": ab}) + "\n")


if __name__ == "__main__":
    main()
