"""Host overhead of one engine step, by phase: a tiny random Llama (2 layers, hidden 64) whose compute is
negligible, so what is left is the engine's own per-step work (schedule, prepare inputs, forward dispatch,
sample, postprocess). Not a test.

  .venv/bin/python benchmarks/engine_step_overhead.py                      # CPU, batch 1 and 64
  .venv/bin/python benchmarks/engine_step_overhead.py --device cuda --async-scheduling on

Phases are host wall time inside the named calls (on CUDA the device runs asynchronously, so a phase that
waits for the device, e.g. reading the sampled ids back, includes that wait). `step` is the whole
`LLMEngine.step()`; `other` is step minus the named phases. Each figure is the median over --repeats runs
of --steps decode steps (all sequences decoding, greedy, EOS ignored), in microseconds per step: wall time,
or with `--clock cpu` the main thread's CPU time (on a loaded CPU machine, where wall time mostly measures
waiting for a core).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "backends", "native_gpu"))

import torch  # noqa: E402

# (phase, path from the engine to the object, method): methods missing from an engine version are skipped
PHASES = [
    ("schedule", "scheduler", "schedule"),
    ("prepare", "runner", "_prepare"),
    ("forward", "runner.model", "forward"),
    ("forward", "runner.graphs", "run"),
    ("sample", "runner.model", "compute_logits"),
    ("sample", "runner", "_sample"),
    ("sample", "runner.sampler", "sample"),
    ("postprocess", "scheduler", "update_from_output"),
    ("postprocess", "", "_make_output"),
]


def tiny_loaded(hidden: int, layers: int, vocab: int):
    from modelplex_native_gpu.loader import LoadedWeights
    from modelplex_native_gpu.models.config import ArchConfig

    values = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=2 * hidden, vocab_size=vocab, max_position_embeddings=4096, eos_token_id=1,
                  tie_word_embeddings=True)
    cfg = ArchConfig.from_hf(values)
    g = torch.Generator().manual_seed(0)
    head_dim, kv = hidden // 4, 2 * (hidden // 4)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.05

    weights = {"model.embed_tokens.weight": w(vocab, hidden), "model.norm.weight": torch.ones(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        weights.update({p + "self_attn.q_proj.weight": w(4 * head_dim, hidden), p + "self_attn.k_proj.weight": w(kv, hidden),
                        p + "self_attn.v_proj.weight": w(kv, hidden), p + "self_attn.o_proj.weight": w(hidden, hidden),
                        p + "mlp.gate_proj.weight": w(2 * hidden, hidden), p + "mlp.up_proj.weight": w(2 * hidden, hidden),
                        p + "mlp.down_proj.weight": w(hidden, 2 * hidden),
                        p + "input_layernorm.weight": torch.ones(hidden),
                        p + "post_attention_layernorm.weight": torch.ones(hidden)})
    return LoadedWeights(cfg, weights)


def resolve(engine, path: str):
    obj = engine
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = time.perf_counter


def instrument(engine, totals: dict) -> None:
    """Wrap each phase's method on its instance: the time inside it adds to totals[phase]."""
    for phase, path, name in PHASES:
        obj = resolve(engine, path)
        method = getattr(obj, name, None) if obj is not None else None
        if method is None:
            continue

        def timed(*args, _method=method, _phase=phase, **kwargs):
            start = clock()
            try:
                return _method(*args, **kwargs)
            finally:
                totals[_phase] += clock() - start

        setattr(obj, name, timed)


def measure(engine, batch: int, steps: int, prompt_len: int, totals: dict) -> dict[str, float]:
    """µs per step by phase over `steps` decode steps of `batch` sequences (prefill and warm-up excluded)."""
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", list(range(2, 2 + prompt_len)), params, detokenize=False)
    for _ in range(4):  # prefill and first decodes (graph capture, warm caches)
        engine.step()
    totals.clear()
    started = clock()
    for _ in range(steps):
        engine.step()
    if engine.runner.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = clock() - started
    while engine.has_unfinished_requests():
        engine.step()
    result = {phase: 1e6 * t / steps for phase, t in totals.items()}
    result["step"] = 1e6 * elapsed / steps
    result["other"] = result["step"] - sum(v for k, v in result.items() if k != "step")
    return result


def make_engine(args, loaded):
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    settings = dict(device=args.device, dtype=args.dtype, skip_tokenizer_init=True, max_model_len=1024,
                    kv_cache_memory_bytes=64 << 20, max_num_seqs=max(args.batch), enforce_eager=args.eager,
                    adaptive_threads=False, num_threads=args.threads)
    if args.async_scheduling != "default":
        settings["async_scheduling"] = args.async_scheduling == "on"
    return LLMEngine(EngineConfig(**settings), loaded=loaded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eager", action="store_true", help="CUDA: no CUDA graphs")
    parser.add_argument("--async-scheduling", choices=("on", "off", "default"), default="default")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="cpu: this thread's CPU time (steadier on a loaded machine; CPU device, 1 thread)")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    engine = make_engine(args, tiny_loaded(64, 2, 512))
    totals: dict[str, float] = defaultdict(float)
    instrument(engine, totals)
    print(f"device {args.device}, {args.dtype}, eager={args.eager}, async_scheduling={args.async_scheduling}; "
          f"{args.clock} µs per decode step, median of {args.repeats} x {args.steps} steps")
    for batch in args.batch:
        runs = [measure(engine, batch, args.steps, args.prompt_len, totals) for _ in range(args.repeats)]
        phases = [p for p in ("schedule", "prepare", "forward", "sample", "postprocess", "other", "step")
                  if any(p in r for r in runs)]
        cells = "  ".join(f"{p} {statistics.median(r.get(p, 0.0) for r in runs):7.1f}" for p in phases)
        print(f"batch {batch:3d}: {cells}", flush=True)


if __name__ == "__main__":
    main()
