"""Batch throughput of the native engine on GGUF-quantized weights vs the same weights dequantized to fp32
(issue 23): the peers' fixed batch (64 prompts x 128 tokens, 128 greedy new tokens, EOS ignored; llm_offline's
workload and race), the two engines interleaved round by round in one process, ratio per round, then medians.

Not a test.
  flock /tmp/bench.lock .venv/bin/python benchmarks/quant_batch.py --model q8.gguf --rounds 3 --out results/x.json
  MODELPLEX_QUANT_GEMM_MIN_TOKENS=1000000 ...   # the integer tiles at every batch size (before quant_gemm.cpp)
  ... --divergence 8   # then: greedy tokens of the first 8 requests alone vs in the batch, on the quantized engine
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "backends", "native_gpu"))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import llm_workloads as W  # noqa: E402
from llm_offline import Ours, race  # noqa: E402


def make_engine(model: str, quantized: bool, threads: int):
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine
    from modelplex_native_gpu.loader import load_weights
    from modelplex_native_gpu.loader.tokenizer import load_tokenizer

    config = EngineConfig(model=model, dtype="float32", quantized_weights=quantized, device="cpu",
                          max_model_len=2048, kv_cache_memory_bytes=1 << 30, max_num_seqs=256, num_threads=threads)
    engine = LLMEngine(config, tokenizer=load_tokenizer(model), loaded=load_weights(model))
    engine.generate([[1, 2, 3, 4]])  # warm-up (and the kernels' build)
    return engine


def divergence(engine, items, count: int) -> dict:
    """Greedy tokens of items[:count] alone (decode below quant_gemm_min_tokens: the integer tiles) vs in the
    batch of all items (quant_gemm), on the same engine: how many are identical, and where the others part."""
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    def generate(batch):
        params = SamplingParams(temperature=0, max_tokens=batch[0].max_tokens, ignore_eos=True)
        return [o[0].token_ids for o in engine.generate([x.prompt_ids for x in batch], params)]

    batched = generate(items)[:count]
    alone = [generate([x])[0] for x in items[:count]]
    firsts = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(alone, batched)]
    return {"requests": count, "identical": sum(f is None for f in firsts),
            "first_difference_at": [f for f in firsts if f is not None]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a GGUF file with quantized weights")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--quiet-s", type=float, default=20.0)
    p.add_argument("--divergence", type=int, default=0,
                   help="requests also run alone after the race, their greedy tokens compared with the batch's")
    p.add_argument("--out", default=None, help="JSON results here")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from modelplex_native_gpu.kernels import cpu

    quant, fp32 = Ours(make_engine(args.model, True, args.threads)), Ours(make_engine(args.model, False, args.threads))
    quant.name, fp32.name = "quantized", "fp32 (dequantized at load)"
    quant.precision = "fp32 activations, weights in the file's blocks"
    items = W.peer_workload(args.prompts, 128, args.gen_tokens)
    table = race([quant, fp32], items, args.rounds, f"{args.prompts}x128", args.quiet_s)
    ratios = [q["tok_s"] / f["tok_s"] for q, f in zip(table[0]["runs"], table[1]["runs"])]
    result = {"model": os.path.basename(args.model), "cpu": W.cpu_model(), "threads": args.threads,
              "quant_gemm_min_tokens_q8_0": torch.ops.modelplex_cpu.quant_gemm_min_tokens(8)
              if cpu.compiled_ops() is not None else None,
              "env_min_tokens": os.environ.get("MODELPLEX_QUANT_GEMM_MIN_TOKENS"),
              "table": table, "ratio_per_round": ratios, "ratio_median": statistics.median(ratios)}
    for row in table:
        print(f"{row['name']}: tok/s per round {[round(r['tok_s'], 1) for r in row['runs']]}, "
              f"foreign cores {[round(r['foreign_cores'], 2) for r in row['runs']]}")
    print(f"quantized / fp32 per round {[round(r, 3) for r in ratios]}, median {result['ratio_median']:.3f}")
    if args.divergence:
        result["divergence"] = divergence(quant.engine, items, args.divergence)
        print("alone vs batched:", json.dumps(result["divergence"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
