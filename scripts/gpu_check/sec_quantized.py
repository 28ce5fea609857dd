"""GGUF-quantized weights on the GPU (issue 23): Llama-3.2-1B-shaped random Q4_0 and Q8_0 files
(benchmarks/make_gguf.py, no tokenizer) served with the weights kept quantized (the Triton quantized matmul),
bf16 activations: weight bytes a decode step reads, single-stream decode against the HBM bound, batch 64;
the throughput section's bf16 figures on the same shape are the baseline."""
from __future__ import annotations

import sys
import time

import torch
from random_models import random_prompts
from sec_throughput import DRY, GPU, batch_rate, copy_bandwidth, free_memory, single_stream

TYPES = ("Q4_0", "Q8_0")


def run(check, report) -> None:
    sys.path.insert(0, str(check.root / "benchmarks"))
    import make_gguf

    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    sizes = DRY if check.dry_run else GPU
    shape = "llama-tiny" if check.dry_run else "llama-3.2-1b"
    cuda = check.device.startswith("cuda")
    bandwidth = copy_bandwidth() if cuda else None
    vocab = make_gguf.SHAPES[shape][5]
    prompts = random_prompts([sizes.prompt_len] * sizes.batch, vocab, seed=7)
    for type_name in TYPES:
        started = time.perf_counter()
        path = make_gguf.make(shape, type_name, str(check.work_dir / f"{shape}-{type_name}.gguf"), with_tokenizer=False)
        report.note(f"{shape} {type_name}: file written in {time.perf_counter() - started:.0f} s")
        engine = LLMEngine(EngineConfig(model=path, device=check.device, dtype="bfloat16", quantized_weights=True,
                                        skip_tokenizer_init=True, max_model_len=1024,
                                        kv_cache_memory_bytes=sizes.kv_bytes, max_num_seqs=max(64, sizes.batch)))
        weight_bytes = engine.runner.weight_bytes
        report.result(f"{type_name} weight bytes", weight_bytes,
                      text=f"{type_name}: weights read per decode step {weight_bytes / 1e9:.3f} GB")
        rate = single_stream(engine, prompts[0], sizes.single_new_tokens)
        bound = f", {rate / (bandwidth / weight_bytes):.0%} of the HBM bound {bandwidth / weight_bytes:.0f} tok/s" \
            if cuda else ""
        report.result(f"{type_name} single-stream decode tok/s", round(rate, 1),
                      text=f"{type_name} single-stream decode: {rate:.1f} tok/s{bound}")
        rate = batch_rate(engine, prompts, sizes.new_tokens)
        report.result(f"{type_name} batch-{sizes.batch} tok/s", round(rate, 1),
                      text=f"{type_name} batch {sizes.batch} x {sizes.prompt_len}+{sizes.new_tokens} tokens: {rate:.1f} "
                           "generated tok/s, prefill included")
        del engine
        free_memory(check.device)
        if cuda:
            report.note(f"peak GPU memory so far {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
