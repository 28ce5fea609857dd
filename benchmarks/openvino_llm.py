"""OpenVINO benchmark, part 2: SmolLM2 throughput on the offline workload (`llm_workloads.variable_workload`)
through OpenVINO GenAI's ContinuousBatchingPipeline vs the native engine, in one process, interleaved.

All get every request at once, greedy, EOS ignored (each request generates exactly its max_tokens),
the same token ids and the same precision (fp32 by default: the token-exact mode of both). OpenVINO runs
`smollm2_ov` as `modelplex convert-openvino` wrote it, with its example config's scheduler settings
and prefix caching on (as the native engine's), and once more with prefix caching off (what the backend
runs while LoRA adapters are registered); the native engine reads the GGUF. Rounds rotate which engine
goes first; ratios are per round (÷ native).
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import llm_workloads as W

NO_PREFIX_CACHE = "OpenVINO GenAI, prefix caching off"


def openvino_pipeline(folder: Path, precision: str, kv_bytes: int, max_num_seqs: int, prefix_caching: bool = True):
    import openvino_genai as og

    scheduler = og.SchedulerConfig()
    scheduler.cache_size = max(1, kv_bytes >> 30)
    scheduler.max_num_seqs, scheduler.max_num_batched_tokens = max_num_seqs, 2048
    scheduler.enable_prefix_caching, scheduler.dynamic_split_fuse = prefix_caching, True
    properties = {"INFERENCE_PRECISION_HINT": precision, "KV_CACHE_PRECISION": precision}
    return og.ContinuousBatchingPipeline(str(folder), scheduler, "CPU", properties)


def native_engine(gguf: Path, precision: str, kv_bytes: int, max_num_seqs: int, max_model_len: int):
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    dtype = {"f32": "float32", "bf16": "bfloat16"}[precision]
    return LLMEngine(EngineConfig(model=str(gguf), dtype=dtype, device="cpu", max_model_len=max_model_len,
                                  kv_cache_memory_bytes=kv_bytes, max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=2048, num_threads=2))


def run_openvino(pipe, items: list[W.WorkItem]) -> dict:
    import numpy as np
    import openvino as ov
    import openvino_genai as og

    t0 = time.perf_counter()
    handles = []
    for i, item in enumerate(items):
        config = og.GenerationConfig()
        config.max_new_tokens, config.ignore_eos, config.do_sample = item.max_tokens, True, False
        handles.append(pipe.add_request(i, ov.Tensor(np.array([item.prompt_ids], dtype=np.int64)), config))
    first, generated = {}, 0
    with W.CpuLoad() as load:
        while pipe.has_non_finished_requests():
            pipe.step()
            now = time.perf_counter()
            for i, handle in enumerate(handles):
                while handle.can_read():
                    generated += sum(len(out.generated_ids) for out in handle.read().values())
                    first.setdefault(i, now)
    wall = time.perf_counter() - t0
    return _result(items, generated, wall, [first[i] - t0 for i in first], load.foreign_cores)


def run_native(engine, items: list[W.WorkItem]) -> dict:
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    t0 = time.perf_counter()
    for i, item in enumerate(items):
        engine.add_request(f"r{i}", item.prompt_ids, SamplingParams(temperature=0, max_tokens=item.max_tokens,
                                                                    ignore_eos=True), detokenize=False)
    first, generated = {}, 0
    with W.CpuLoad() as load:
        while engine.has_unfinished_requests():
            outputs = engine.step()
            now = time.perf_counter()
            for out in outputs:
                generated += len(out.new_token_ids)
                first.setdefault(out.request_id, now)
    wall = time.perf_counter() - t0
    return _result(items, generated, wall, [t - t0 for t in first.values()], load.foreign_cores)


def _result(items, generated: int, wall: float, ttfts: list[float], foreign: float) -> dict:
    expected = sum(item.max_tokens for item in items)
    assert generated == expected, f"generated {generated} tokens, expected {expected}"
    return {"tok_s": generated / wall, "wall_s": wall, "ttft_ms_p50": 1e3 * W.percentile(ttfts, 50),
            "foreign_cores": foreign}


def run_rounds(args, folder: Path, gguf: Path, log) -> tuple[list[dict], dict]:
    """`args.llm_rounds` rounds of both engines on the same workload, the first engine alternating."""
    items = W.variable_workload(args.llm_requests, 32, args.llm_max_prompt, 16, args.llm_max_output,
                                system_len=args.llm_max_prompt // 2)
    max_len = max(len(x.prompt_ids) + x.max_tokens for x in items) + 16
    kv_bytes = 1 << 30
    runners = {"OpenVINO GenAI": (openvino_pipeline(folder, args.llm_precision, kv_bytes, args.llm_requests),
                                  run_openvino),
               NO_PREFIX_CACHE: (openvino_pipeline(folder, args.llm_precision, kv_bytes, args.llm_requests,
                                                   prefix_caching=False), run_openvino),
               "native engine": (native_engine(gguf, args.llm_precision, kv_bytes, args.llm_requests, max_len),
                                 run_native)}
    for _name, (engine, run) in runners.items():  # warm-up: compile, first allocations
        run(engine, items[:2])
    rounds = []
    for i in range(args.llm_rounds):
        order = list(runners)[i % len(runners):] + list(runners)[:i % len(runners)]
        result = {}
        for name in order:
            engine, run = runners[name]
            result[name] = run(engine, items)
            log("llm round %d %s: %.1f tok/s, TTFT p50 %.0f ms, foreign cores %.2f" % (
                i + 1, name, result[name]["tok_s"], result[name]["ttft_ms_p50"], result[name]["foreign_cores"]))
        rounds.append(result)
    workload = {"requests": len(items), "prompt_tokens": sum(len(x.prompt_ids) for x in items),
                "generated_tokens": sum(x.max_tokens for x in items)}
    return rounds, workload


def report(rounds: list[dict], workload: dict, args) -> str:
    def spread(values, digits=1):
        return "%.*f (%.*f–%.*f)" % (digits, statistics.median(values), digits, min(values), digits, max(values))

    lines = ["## SmolLM2-135M, offline workload: OpenVINO GenAI vs the native engine", "",
             "`variable_workload(%d requests, prompts 32–%d tokens, outputs 16–%d, a quarter sharing a %d-token "
             "prefix)`: %d prompt tokens, %d generated; all requests at once, greedy, EOS ignored, precision %s "
             "(inference and KV cache), 2 threads, 1 GiB of KV cache each. %d rounds, the first engine "
             "rotating. The last row is what a pipeline with LoRA adapters registered runs like (the backend turns "
             "prefix caching off then)." % (
                 workload["requests"], args.llm_max_prompt, args.llm_max_output, args.llm_max_prompt // 2,
                 workload["prompt_tokens"], workload["generated_tokens"], args.llm_precision, len(rounds)), "",
             "| engine | generated tok/s, median (min–max) | ÷ native, per round | TTFT p50 ms | other tenants' cores |",
             "|---|---|---|---|---|"]
    for name in ("native engine", "OpenVINO GenAI", NO_PREFIX_CACHE):
        ratios = [r[name]["tok_s"] / r["native engine"]["tok_s"] for r in rounds]
        lines.append("| %s | %s | %s | %s | %s |" % (
            name, spread([r[name]["tok_s"] for r in rounds]), spread(ratios, 3),
            spread([r[name]["ttft_ms_p50"] for r in rounds], 0), spread([r[name]["foreign_cores"] for r in rounds], 2)))
    return "\n".join(lines) + "\n"
