"""KV block size and round-to-round state of the native engine (issue 23): engines run a workload round by round
in ONE process, interleaved (engine A round 1, engine B round 1, A round 2, ...), as llm_offline's races reuse
our engine. Not a test.

  flock /tmp/bench.lock .venv/bin/python benchmarks/llm_blocks.py --engines 16,16fresh --rounds 4
  flock /tmp/bench.lock .venv/bin/python benchmarks/llm_blocks.py --engines 16,32,64,128 --workload fixed

`--engines`: one entry per engine, its block size in tokens; a `fresh` suffix builds a new engine (same loaded
weights) before each of its rounds instead of reusing one, a `reset` suffix resets its prefix cache before each
round (LLMEngine.reset_prefix_cache, as the vLLM peer does). Workloads: `subset` = the first 32 requests of
llm_offline's variable workload (its `--subset 32` race), `fixed` = the peers' 64 x 128 -> 128 batch.
Per round and engine: generated tok/s, ITL p50, decode-only steps (count, ms), blocks per contiguous ascending run
in the tables those steps read, the copy bandwidth just before the round, minor page faults of the process during
the round, AnonHugePages, foreign cores. Each round uses its own cache salt, as llm_offline does.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import llm_workloads as W  # noqa: E402


def make_engine(args, loaded, block_size: int):
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    config = EngineConfig(model=args.model, dtype=args.dtype, quantized_weights=False, device="cpu",
                          max_model_len=2048, kv_cache_memory_bytes=1 << 30, max_num_seqs=256,
                          num_threads=args.threads, skip_tokenizer_init=True, block_size=block_size)
    engine = LLMEngine(config, loaded=loaded)
    engine.generate([[1, 2, 3, 4]])  # warm-up
    return engine


def huge_mib() -> float:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("AnonHugePages")) / 1024


def run_round(engine, items) -> dict:
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    scheduler, captured = engine.scheduler, []
    schedule = scheduler.schedule

    def capturing_schedule():
        out = schedule()
        captured.append(out)
        return out

    scheduler.schedule = capturing_schedule
    salt = f"run-{time.monotonic_ns()}"
    bandwidth = W.measure_bandwidth(256 << 20, 3)
    faults0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    for i, item in enumerate(items):
        engine.add_request(f"r{i}", item.prompt_ids, SamplingParams(temperature=0, max_tokens=item.max_tokens,
                                                                    ignore_eos=True), cache_salt=salt,
                           detokenize=False)
    last, itls, generated = {}, [], 0
    decode_s, decode_steps, blocks, runs = 0.0, 0, 0, 0
    with W.CpuLoad() as load:
        while engine.has_unfinished_requests():
            captured.clear()
            start = time.perf_counter()
            outputs = engine.step()
            now = time.perf_counter()
            for out in outputs:
                generated += len(out.new_token_ids)
                if out.request_id in last:
                    itls.append(now - last[out.request_id])
                last[out.request_id] = now
            out = captured[0] if captured else None
            if out is not None and out.requests and all(n == 1 for n in out.num_scheduled_tokens) and \
                    all(r.num_computed_tokens >= r.num_prompt_tokens for r in out.requests):
                decode_s += now - start
                decode_steps += 1
                for tables in out.block_tables:
                    t = tables[0]
                    blocks += len(t)
                    runs += 1 + sum(b != a + 1 for a, b in zip(t, t[1:]))
    wall = time.perf_counter() - t0
    del scheduler.schedule
    return {"tok_s": generated / wall, "wall_s": wall, "itl_ms_p50": 1e3 * W.percentile(itls, 50),
            "decode_steps": decode_steps, "decode_step_ms": 1e3 * decode_s / max(decode_steps, 1),
            "blocks_per_run": blocks / max(runs, 1), "copy_gb_s": bandwidth / 1e9,
            "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0,
            "huge_mib": huge_mib(), "foreign_cores": load.foreign_cores}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="16,32,64", help="comma list of block sizes, each optionally + 'fresh'")
    p.add_argument("--workload", default="subset", choices=["subset", "fixed"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quiet-s", type=float, default=20.0)
    p.add_argument("--out", default=None, help="append one JSON line with every round here")
    args = p.parse_args()
    import torch
    from llm_offline import default_model

    from modelplex_native_gpu.loader import load_weights

    torch.set_num_threads(args.threads)
    args.model = default_model()
    loaded = load_weights(args.model)
    names = args.engines.split(",")
    specs = [(int(e.removesuffix("fresh").removesuffix("reset")), e.endswith("fresh")) for e in names]
    engines = [None if fresh else make_engine(args, loaded, bs) for bs, fresh in specs]
    items = W.variable_workload()[:32] if args.workload == "subset" else W.peer_workload()
    rows = [[] for _ in specs]
    for r in range(args.rounds):
        for i, (bs, fresh) in enumerate(specs):
            if fresh:
                engines[i] = None
                gc.collect()
                engines[i] = make_engine(args, loaded, bs)
            if names[i].endswith("reset"):
                assert engines[i].reset_prefix_cache()
            W.wait_quiet(timeout_s=args.quiet_s)
            res = run_round(engines[i], items)
            rows[i].append(res)
            print(f"[round {r + 1}] {names[i]}: " + json.dumps({k: round(v, 3) for k, v in res.items()}),
                  flush=True)
    for i, name in enumerate(names):
        tok = [x["tok_s"] for x in rows[i]]
        paired = [x["tok_s"] / b["tok_s"] for x, b in zip(rows[i], rows[0])]
        print(f"{name}: tok/s median {statistics.median(tok):.1f}; vs {names[0]} per round "
              + ", ".join(f"{x:.3f}" for x in paired))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps({"workload": args.workload, "dtype": args.dtype, "engines": args.engines,
                                "cpu": W.cpu_model(), "rounds": rows}) + "\n")


if __name__ == "__main__":
    main()
