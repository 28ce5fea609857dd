"""The Llama-3.1-8B-shaped Q4_0 GGUF (make_gguf.py, ~4.5 GB, random weights) served by `modelplex serve` on a
24 GB machine: peak RSS of the server against file size + KV cache, and single-stream decode next to
llama.cpp's `llama-bench` on the same file, in the same run.

Not a test. Example:
  flock /tmp/bench.lock .venv/bin/python benchmarks/gguf_serve_8b.py --dir /tmp/gguf-8b \
      --llama-bench /work/peers/llama.cpp-build/bin/llama-bench --json benchmarks/results/gguf_8b.json
The file is made in --dir when missing (--delete removes it at the end). A model repository holding it
(config.pbtxt: backend native_gpu, default dtype rule, weights kept quantized, --kv-mib of KV cache) is
served on ephemeral ports; --requests POSTs to /v1/completions, one at a time (random prompt of 32 tokens,
--tokens new tokens, ignore_eos). Decode tok/s = count / sum of the engine's inter-token latencies (the
`vllm:inter_token_latency_seconds` histogram on /metrics); KV cache bytes = num_gpu_blocks (from
`vllm:cache_config_info`) x bytes a block. Peak RSS: VmHWM of the server and of any process it started
(the engine may run in its own), read after the requests. Then the server stops and `llama-bench -p 0
-n --tokens -t 2 -r --requests` runs on the same file.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "tests"), str(HERE), str(ROOT / "backends" / "native_gpu")]

import make_gguf  # noqa: E402
from gguf_decode import cpu_flags  # noqa: E402
from helpers.serverproc import ServerProcess  # noqa: E402

CONFIG = """\
name: "{name}"
backend: "native_gpu"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }}
]
output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "max_model_len" value {{ string_value: "{max_model_len}" }} }}
parameters {{ key: "kv_cache_memory_bytes" value {{ string_value: "{kv_bytes}" }} }}
parameters {{ key: "num_threads" value {{ string_value: "2" }} }}
parameters {{ key: "adaptive_threads" value {{ string_value: "false" }} }}
"""


def repository(base: Path, gguf: Path, args) -> Path:
    folder = base / "repo" / "llama8b"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    link = folder / "1" / "model.gguf"
    if not link.exists():
        link.symlink_to(gguf)
    (folder / "config.pbtxt").write_text(CONFIG.format(name="llama8b", max_model_len=args.max_model_len,
                                                       kv_bytes=args.kv_mib << 20))
    return base / "repo"


def process_tree(pid: int) -> list[int]:
    pids, i = [pid], 0
    while i < len(pids):
        for task in Path(f"/proc/{pids[i]}/task").glob("*"):
            children = (task / "children").read_text().split() if (task / "children").exists() else []
            pids.extend(int(c) for c in children)
        i += 1
    return pids


def status_bytes(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1)) * 1024


def metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M))


def kv_cache_bytes(text: str, block_bytes: int) -> int:
    m = re.search(r'^vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', text, re.M)
    return int(m.group(1)) * block_bytes


def serve(repo: Path, args) -> dict:
    import httpx

    hidden, _, layers, heads, kv_heads, _, _, _ = make_gguf.SHAPES[args.shape]
    head_dim = make_gguf.HEAD_DIM.get(args.shape, hidden // heads)
    kv_per_token = 2 * layers * kv_heads * head_dim  # K and V values a token keeps
    started = time.perf_counter()
    with ServerProcess([repo], timeout=1800) as server:  # the ports are written once the model is loaded
        client = httpx.Client(base_url=f"http://{server.http_url}", timeout=1800)
        while client.get("/v2/models/llama8b/ready").status_code != 200:
            if server.proc.poll() is not None or time.perf_counter() - started > 1800:
                raise RuntimeError(f"the model did not load:\n{server.log()[-3000:]}")
            time.sleep(1)
        load_s = time.perf_counter() - started
        rss_loaded = {p: status_bytes(p, "VmRSS") for p in process_tree(server.proc.pid)}
        walls = []
        for r in range(args.requests):
            prompt = " ".join(f"w{(r * 997 + i * 31) % 5000}" for i in range(32))
            t0 = time.perf_counter()
            reply = client.post("/v1/completions", json={"model": "llama8b", "prompt": prompt, "max_tokens": args.tokens,
                                                         "temperature": 0, "ignore_eos": True})
            walls.append(time.perf_counter() - t0)
            reply.raise_for_status()
            assert reply.json()["usage"]["completion_tokens"] == args.tokens, reply.text
            print(f"  request {r}: {args.tokens} tokens in {walls[-1]:.1f} s (load {os.getloadavg()[0]:.1f})", flush=True)
        text = httpx.get(server.metrics_url).text
        tree = process_tree(server.proc.pid)
        peaks = {p: status_bytes(p, "VmHWM") for p in tree}
        log = server.log()
    itl_sum = metric(text, "vllm:inter_token_latency_seconds_sum")
    itl_count = metric(text, "vllm:inter_token_latency_seconds_count")
    logged = re.findall(r"dtype (\w+) \((.*)\)$", log, re.M)
    dtype = logged[-1] if logged else rule_dtype()
    block_bytes = 16 * kv_per_token * (4 if dtype[0] == "float32" else 2)  # 16-token blocks
    return {"load_s": load_s, "request_wall_s": walls, "decode_tok_s": itl_count / itl_sum,
            "kv_cache_bytes": kv_cache_bytes(text, block_bytes), "peak_rss_bytes": peaks,
            "rss_after_load_bytes": rss_loaded, "dtype_log": dtype}


def rule_dtype() -> tuple[str, str]:
    """The dtype the engine picks for this repository (no `dtype` parameter, weights kept quantized on the CPU)
    when the server's log lacks the engine's "dtype ..." line: an engine in its own process logs warnings only."""
    from modelplex_native_gpu.dtype_rule import choose_dtype

    choice = choose_dtype(None, "cpu", keeps_quantized=True)
    return choice.dtype, f"{choice.reason}; not in the server's log, from dtype_rule.choose_dtype"


def llama_bench(binary: str, path: Path, args) -> dict | None:
    cmd = [binary, "-m", str(path), "-p", "0", "-n", str(args.tokens), "-t", "2", "-r", str(args.requests), "-o", "json"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        print(f"llama-bench failed: {result.stderr[-1000:]}", file=sys.stderr)
        return None
    row = json.loads(result.stdout)[0]
    return {"avg_ts": row["avg_ts"], "samples_ts": row.get("samples_ts")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/gguf-8b")
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH", ""))
    ap.add_argument("--shape", choices=sorted(make_gguf.SHAPES), default="llama-3.1-8b")
    ap.add_argument("--type", choices=sorted(make_gguf.CODE_STD), default="Q4_0")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--kv-mib", type=int, default=256)
    ap.add_argument("--delete", action="store_true", help="remove the GGUF file at the end")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    gguf = base / f"{args.shape}-{args.type}.gguf"
    if not gguf.exists():
        t = time.perf_counter()
        make_gguf.make(args.shape, args.type, str(gguf))
        print(f"made {gguf} in {time.perf_counter() - t:.0f} s")
    file_bytes = gguf.stat().st_size
    print(f"CPU flags: {cpu_flags()}; {gguf.name}: {file_bytes / 1e9:.2f} GB", flush=True)
    try:
        ours = serve(repository(base, gguf, args), args)
        theirs = llama_bench(args.llama_bench, gguf, args) if args.llama_bench else None
    finally:
        if args.delete:
            gguf.unlink()
    peak = sum(ours["peak_rss_bytes"].values())
    bound = file_bytes + ours["kv_cache_bytes"]
    print(f"\n| | |\n| --- | --- |\n| file | {file_bytes / 1e9:.2f} GB |\n| KV cache | {ours['kv_cache_bytes'] / 1e9:.2f} GB |"
          f"\n| peak RSS (server + children, VmHWM) | {peak / 1e9:.2f} GB |\n| peak / (file + KV) | {peak / bound:.2f} |"
          f"\n| load until ready | {ours['load_s']:.0f} s |\n| dtype | {ours['dtype_log']} |"
          f"\n| ours decode tok/s ({args.requests} x {args.tokens} tokens) | {ours['decode_tok_s']:.2f} |")
    if theirs:
        print(f"| llama-bench tg{args.tokens} tok/s | {theirs['avg_ts']:.2f} |\n"
              f"| ours / llama.cpp | {ours['decode_tok_s'] / theirs['avg_ts']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu_flags": cpu_flags(), "args": vars(args), "file_bytes": file_bytes,
                                               "ours": ours, "llama_bench": theirs,
                                               "peak_over_file_plus_kv": peak / bound}, indent=1))


if __name__ == "__main__":
    main()
