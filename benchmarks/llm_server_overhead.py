"""What the server path costs an LLM: one mixed workload run in-process (the engine stepped directly, as
llm_offline.py does) and through `modelplex serve` (32 concurrent streaming `/v1/completions`), same
weights, same engine settings, rounds interleaved in one run.

Not a test. Reports generated tok/s per contender per round and the median of the paired ratios
server / in-process (issue 24's goal: >= 0.9).
  flock /tmp/bench.lock .venv/bin/python benchmarks/llm_server_overhead.py --rounds 3 --out /tmp/overhead.json
Each round's prompts start with a round-specific token, so no round reuses another's prefix-cache
blocks (within a round, a quarter of the requests share a system prompt in both contenders alike).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import llm_serving_servers as S  # noqa: E402
import llm_workloads as W  # noqa: E402

MAX_MODEL_LEN = 2048


def workload(num_requests: int, max_output: int) -> list[W.WorkItem]:
    """The variable workload's first requests (prompts 32-1024 tokens, a quarter sharing a 512-token
    system prompt), outputs capped at `max_output`."""
    items = W.variable_workload(256)[:num_requests]
    return [W.WorkItem(x.prompt_ids, min(x.max_tokens, max_output)) for x in items]


def for_round(items: list[W.WorkItem], round_index: int) -> list[W.WorkItem]:
    return [W.WorkItem([300 + round_index, *x.prompt_ids[1:]], x.max_tokens) for x in items]


def engine_settings(args) -> dict:
    return {"dtype": args.dtype, "max_model_len": MAX_MODEL_LEN, "kv_cache_memory_bytes": args.kv_bytes,
            "num_threads": args.threads, "max_num_seqs": args.max_num_seqs}


def write_repository(root: Path, args) -> Path:
    """The example `smollm2` model with this benchmark's engine settings in its config.pbtxt."""
    S.modelplex_repository(root, kv_tokens=args.kv_bytes // 46080, threads=args.threads)
    config = root / S.MODEL_NAME / "config.pbtxt"
    text = config.read_text()
    for key, value in engine_settings(args).items():
        line = f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}'
        pattern = rf'parameters \{{ key: "{key}" value \{{ string_value: "[^"]*" \}} \}}'
        text, found = re.subn(pattern, line, text)
        if not found:
            text += line + "\n"
    config.write_text(text)
    return root / S.MODEL_NAME / "1" / "model.gguf"


async def _one(client: httpx.AsyncClient, item: W.WorkItem) -> int:
    body = {"model": S.MODEL_NAME, "prompt": item.prompt_ids, "max_tokens": item.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    tokens = usage["completion_tokens"]
    if tokens != item.max_tokens:
        raise RuntimeError(f"server generated {tokens} tokens, asked {item.max_tokens}")
    return tokens


async def _through_server(base_url: str, items: list[W.WorkItem]) -> dict:
    limits = httpx.Limits(max_connections=len(items) + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=None, limits=limits) as client:
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(_one(client, x) for x in items))
        wall = time.perf_counter() - t0
    return {"generated_tokens": sum(counts), "wall_s": wall, "tok_s": sum(counts) / wall}


def in_process(engine, items: list[W.WorkItem]) -> dict:
    """Every request added at once, the engine stepped until done, text detokenized as the server does."""
    from modelplex_native_gpu.engine.sampling_params import SamplingParams

    t0 = time.perf_counter()
    for i, item in enumerate(items):
        engine.add_request(f"r{i}-{t0}", item.prompt_ids, SamplingParams(temperature=0, max_tokens=item.max_tokens,
                                                                         ignore_eos=True))
    generated = 0
    while engine.has_unfinished_requests():
        generated += sum(len(out.new_token_ids) for out in engine.step())
    wall = time.perf_counter() - t0
    return {"generated_tokens": generated, "wall_s": wall, "tok_s": generated / wall}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-output", type=int, default=256, help="cap on each request's output tokens")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--kv-bytes", type=int, default=512 << 20)
    p.add_argument("--quiet-s", type=float, default=20.0, help="wait up to this long for a quiet machine per run")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from modelplex_native_gpu.config import EngineConfig
    from modelplex_native_gpu.engine.llm_engine import LLMEngine

    items = workload(args.requests, args.max_output)
    root = Path(tempfile.mkdtemp(prefix="llm-overhead-"))
    gguf = write_repository(root / "repo", args)
    engine = LLMEngine(EngineConfig(model=str(gguf), device="cpu", **engine_settings(args)))
    engine.generate([[1, 2, 3, 4]])  # warm-up, as the server's first request would be
    port = S.free_port()
    server = S.RunningServer(S.modelplex_spec(root / "repo", port), port, root / "server.log")
    rows: list[dict] = []
    try:
        server.wait_ready()
        asyncio.run(_through_server(server.base_url, workload(2, 8)))  # warm-up
        for r in range(args.rounds):
            round_items = for_round(items, r)
            row = {"round": r + 1}
            W.wait_quiet(timeout_s=args.quiet_s)
            row["server"] = asyncio.run(_through_server(server.base_url, round_items))
            W.wait_quiet(timeout_s=args.quiet_s)
            row["in_process"] = in_process(engine, round_items)
            row["ratio"] = row["server"]["tok_s"] / row["in_process"]["tok_s"]
            row["load_avg"] = os.getloadavg()[0]
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.stop()
    result = {"cpu": W.cpu_model(), "settings": engine_settings(args), "requests": args.requests,
              "generated_tokens_per_round": sum(x.max_tokens for x in items), "rounds": rows,
              "median_ratio": statistics.median(r["ratio"] for r in rows)}
    print(f"server / in-process tok/s, median of {len(rows)} paired rounds: {result['median_ratio']:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
