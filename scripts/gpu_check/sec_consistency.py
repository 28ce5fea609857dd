"""Batch invariance of the engine in fp32: batched (with and without async scheduling), CUDA-graph vs eager,
chunked-prefill, prefix-cached and preempted runs give the same greedy tokens as running each prompt alone
(synchronously)."""
from __future__ import annotations

import torch
from random_models import Shape, loaded_weights, make_engine, make_hf_model, random_prompts

MAX_MODEL_LEN = 128
NUM_NEW_TOKENS = 32


def run(check, report) -> None:
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    shape = (Shape("llama-tiny", "LlamaForCausalLM", 64, 2, 4, 2, 128, 256) if check.dry_run else
             Shape("llama-small", "LlamaForCausalLM", 512, 4, 8, 2, 1408, 4096))
    hf = make_hf_model(shape, "float32", check.device, seed=0)
    loaded = loaded_weights(hf, shape)
    del hf
    prompts = random_prompts([3, 9, 17, 24, 31, 50], shape.vocab, seed=5, prefix=40)
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    kv_bytes = 64 << 20

    def engine(**config):
        return make_engine(loaded, check.device, "float32", max_model_len=MAX_MODEL_LEN,
                           kv_cache_memory_bytes=config.pop("kv_cache_memory_bytes", kv_bytes), **config)

    alone = engine(enable_prefix_caching=False, async_scheduling=False)  # the plain loop: one step at a time
    reference = [alone.generate([p], params)[0][0].token_ids for p in prompts]
    del alone

    def compare(name: str, outputs, extra: str = "") -> None:
        tokens = [o[0].token_ids for o in outputs]
        same = sum(a == b for a, b in zip(tokens, reference))
        report.result(name, f"{same}/{len(prompts)}", ok=same == len(prompts),
                      text=f"{name}: {same}/{len(prompts)} sequences equal to the one-at-a-time run{extra}")

    batched = engine(enable_prefix_caching=False)
    compare("batched", batched.generate(prompts, params))
    flipped = engine(enable_prefix_caching=False, async_scheduling=not batched.async_scheduling)
    compare(f"batched, async scheduling {'on' if flipped.async_scheduling else 'off'}", flipped.generate(prompts, params))
    del flipped
    if check.device.startswith("cuda"):
        eager = engine(enable_prefix_caching=False, enforce_eager=True)
        compare("batched, eager (no CUDA graphs)", eager.generate(prompts, params))
        report.note(f"CUDA graphs captured for batch sizes {sorted(batched.runner.graphs.graphs)}")
        del eager
    del batched
    chunked = engine(enable_prefix_caching=False, max_num_batched_tokens=16)
    compare("chunked prefill (16-token budget)", chunked.generate(prompts, params))
    del chunked
    cached = engine(enable_prefix_caching=True)
    cached.generate(prompts[:1], params)
    outputs = cached.generate(prompts, params)
    hits = sum(o[0].num_cached_tokens for o in outputs)
    report.result("prefix-cached tokens", hits, ok=hits > 0, text=f"prefix cache: {hits} prompt tokens read from cache")
    compare("prefix-cached", outputs)
    del cached
    block_bytes = 2 * shape.layers * 16 * shape.kv_heads * (shape.hidden // shape.heads) * 4
    tight = engine(enable_prefix_caching=False, kv_cache_memory_bytes=14 * block_bytes)
    outputs = tight.generate(prompts, params)
    preemptions = tight.stats()["num_preemptions"]
    report.result("preemptions", preemptions, ok=preemptions > 0,
                  text=f"preemption: {preemptions} preemptions with 13 usable KV blocks")
    compare("preempted", outputs)
    del tight
    if check.device.startswith("cuda"):
        torch.cuda.empty_cache()
