"""Single-stream decode on quantized GGUF files: our engine (weights kept quantized) vs the memory-bandwidth
bound and llama.cpp's `llama-bench` tg128, measured side by side in the same run.

Not a test. Examples:
  .venv/bin/python benchmarks/gguf_decode.py --dir /tmp/gguf-bench --llama-bench PATH/llama-bench
  .venv/bin/python benchmarks/gguf_decode.py --ab /work/main,. --only 1b-Q4_0 --rounds 5   # two checkouts, paired
Files: benchmarks/make_gguf.py's random SmolLM2-135M- and Llama-3.2-1B-shaped models in Q8_0 and Q4_0 (made
in --dir when missing). Per round (--rounds), for each file: our decode, then llama-bench (-p 0 -n 128 -t 2
-r 1), alternating, so both see the same machine, the copy bandwidth measured before each; medians over
rounds, of the contenders' rates and of each round's ratio. Our decode: one request, a 16-token
prompt, 128 new tokens, EOS ignored, 2 threads; tok/s = 127 / (last token - first token).
The bound: bytes one token reads (every linear weight as stored, LM head included, norms; the KV cache and
embedding row are negligible at this context) over the copy bandwidth (read + write bytes of a 1 GiB
torch copy on 2 threads), measured each round. Peak RSS while loading vs the file's size comes from a
child process that only loads. The machine is shared: the load average is reported with each round.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if "--worker" not in sys.argv:  # an --ab worker takes the engine from its checkout's PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "backends", "native_gpu"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import torch  # noqa: E402

FILES = [("smollm2-135m", "Q8_0"), ("smollm2-135m", "Q4_0"), ("llama-3.2-1b", "Q8_0"), ("llama-3.2-1b", "Q4_0")]
NEW_TOKENS = 128


def cpu_flags() -> str:
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")
    return " ".join(f for f in wanted if f in flags)


def copy_bandwidth(repeats: int = 5) -> float:
    """Median GB/s of a 1 GiB fp32 copy (read + write bytes), 2 threads."""
    a = torch.ones(1 << 28)
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        b.copy_(a)
        times.append(time.perf_counter() - t)
    return 2 * a.numel() * 4 / statistics.median(times) / 1e9


ENGINE = dict(device="cpu", dtype="float32", quantized_weights=True, num_threads=2, adaptive_threads=False,
              max_model_len=512, kv_cache_memory_bytes=64 << 20, skip_tokenizer_init=True, enable_prefix_caching=False)


def make_engine(path: str):
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=path, **ENGINE))


def our_decode(engine, seed: int) -> float:
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    prompt = [int(t) for t in torch.randint(3, 40000, (16,), generator=torch.Generator().manual_seed(seed))]
    engine.add_request(f"r{seed}", prompt, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True),
                       detokenize=False)
    stamps = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            stamps.extend([time.perf_counter()] * len(out.new_token_ids))
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def llama_bench(binary: str, path: str) -> float | None:
    cmd = [binary, "-m", path, "-p", "0", "-n", str(NEW_TOKENS), "-t", "2", "-r", "1", "-o", "json"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        print(f"llama-bench failed on {path}: {result.stderr[-500:]}", file=sys.stderr)
        return None
    return float(json.loads(result.stdout)[0]["avg_ts"])


def worker(path: str) -> None:
    """Line protocol for --ab: prints 'ready', then one decode's tok/s (after a warm-up decode) per 'run' line."""
    import llm_workloads as W

    engine = make_engine(path)
    import modelplex_native_gpu

    print(f"worker engine from {os.path.dirname(modelplex_native_gpu.__file__)}", file=sys.stderr)
    print("ready", flush=True)
    for r, line in enumerate(sys.stdin):
        if line.strip() != "run":
            break
        our_decode(engine, seed=1000 + r)
        with W.CpuLoad() as load:
            tok_s = our_decode(engine, seed=r)
        print(json.dumps({"tok_s": tok_s, "foreign_cores": load.foreign_cores}), flush=True)


def ab(trees: list[str], path: str, rounds: int) -> None:
    """Our decode on one file from two checkouts (a worker process each, engines loaded once), A then B each
    round, with the copy bandwidth before each round."""
    import llm_workloads as W

    procs = []
    for tree in trees:
        folders = ["platform", "backends/native_gpu"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.join(tree, f) for f in folders))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", path], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    print(f"copy {copy_bandwidth():.1f} GB/s before the rounds")
    result = W.paired_rounds(procs, rounds, quiet_s=10.0)
    print(f"copy {copy_bandwidth():.1f} GB/s after; {os.path.basename(path)} A={trees[0]} B={trees[1]}")
    print(f"A tok/s median {statistics.median(r[0] for r in result):.1f}, B {statistics.median(r[1] for r in result):.1f}, "
          f"B/A median {statistics.median(r[1] / r[0] for r in result):.3f}")


def load_memory(path: str) -> dict:
    from helpers.load_memory import measure_load

    m = measure_load(model=path, **ENGINE)
    return {"file_mb": os.path.getsize(path) / 1e6, "rss_before_mb": m.before / 1e6, "rss_after_load_mb": m.after / 1e6,
            "peak_rss_mb": m.peak / 1e6, "weights_mb": m.weight_bytes / 1e6, "peak_over_final": m.peak_over_final}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/gguf-bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH", ""))
    ap.add_argument("--only", default="", help="comma-separated substrings of file names to run")
    ap.add_argument("--json", default="")
    ap.add_argument("--ab", default="", help="two checkouts A,B: our decode only, paired (one file: --only)")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.worker:
        return worker(args.worker)
    os.makedirs(args.dir, exist_ok=True)
    import make_gguf

    paths = []
    for shape, type_name in FILES:
        path = os.path.join(args.dir, f"{shape}-{type_name}.gguf")
        if args.only and not any(s in path for s in args.only.split(",")):
            continue
        if not os.path.exists(path):
            make_gguf.make(shape, type_name, path)
        paths.append(path)
    print(f"CPU flags: {cpu_flags()}; torch {torch.__version__}, 2 threads")
    if args.ab:
        if len(paths) != 1:
            raise SystemExit("--ab measures one file: name it with --only")
        return ab([os.path.abspath(t) for t in args.ab.split(",")], paths[0], args.rounds)
    memory = {p: load_memory(p) for p in paths}
    engines = {p: make_engine(p) for p in paths}
    has_llama = bool(args.llama_bench) and os.path.exists(args.llama_bench)
    rows = {p: {"ours": [], "llama.cpp": [], "bound": [], "copy_ours": [], "copy_llama": []} for p in paths}
    for r in range(args.rounds):
        print(f"round {r}: load average {os.getloadavg()[0]:.1f}")
        for p in paths:
            our_decode(engines[p], seed=1000 + r)  # warm-up (first steps allocate)
            bandwidth = copy_bandwidth()
            ours = our_decode(engines[p], seed=r)
            rows[p]["ours"].append(ours)
            rows[p]["copy_ours"].append(bandwidth)
            rows[p]["bound"].append(bandwidth * 1e9 / engines[p].runner.weight_bytes)
            line = f"  {os.path.basename(p)}: ours {ours:.1f} tok/s (copy {bandwidth:.1f} GB/s)"
            if has_llama:
                rows[p]["copy_llama"].append(copy_bandwidth())
                rows[p]["llama.cpp"].append(llama_bench(args.llama_bench, p) or float("nan"))
                line += (f", llama.cpp {rows[p]['llama.cpp'][-1]:.1f} (copy {rows[p]['copy_llama'][-1]:.1f} GB/s), "
                         f"ratio {ours / rows[p]['llama.cpp'][-1]:.2f}")
            print(line + f", bound {rows[p]['bound'][-1]:.1f}")
    # The machine's memory bandwidth moves between states (~40 and ~70 GB/s of copy here), sometimes within a
    # round: each round's ratio pairs two runs, and a round counts as one state where the copy bandwidth before
    # each run differs by under 15%.
    print("\n| file | MB | peak RSS at load / final (MB) | ours tok/s | llama.cpp tg128 | ours / llama.cpp "
          "(medians) | per round (median) | one-state rounds | bound tok/s | ours / bound |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    summary = {}
    for p in paths:
        m, row = memory[p], rows[p]
        ours, bound = statistics.median(row["ours"]), statistics.median(row["bound"])
        theirs = statistics.median(row["llama.cpp"]) if row["llama.cpp"] else None
        ratios = [a / b for a, b in zip(row["ours"], row["llama.cpp"])]
        same = [abs(a - b) < 0.15 * max(a, b) for a, b in zip(row["copy_ours"], row["copy_llama"])]
        per_round = (", ".join(f"{x:.2f}" for x in ratios) + f" ({statistics.median(ratios):.2f})") if ratios else "-"
        print(f"| {os.path.basename(p)} | {m['file_mb']:.0f} | {m['peak_rss_mb']:.0f} / {m['rss_after_load_mb']:.0f} "
              f"(+{m['peak_rss_mb'] - m['rss_before_mb']:.0f} / +{m['rss_after_load_mb'] - m['rss_before_mb']:.0f}) | "
              f"{ours:.1f} | {theirs or float('nan'):.1f} | {f'{ours / theirs:.2f}' if theirs else '-'} | {per_round} | "
              f"{sum(same)} of {len(same)} | {bound:.1f} | {ours / bound:.0%} |")
        summary[os.path.basename(p)] = {"memory": m, **row}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu_flags": cpu_flags(), "results": summary}, f, indent=1)
    print(f"max RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB")


if __name__ == "__main__":
    main()
