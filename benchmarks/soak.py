"""Soak: minutes of mixed traffic at high concurrency while models are reloaded, unloaded and (where
the LLM's backend serves them) LoRA adapters swapped; stops by itself, loopback only.

Traffic (client threads in this process): `simple` and `minilm` over gRPC (tritonclient, answers
checked), a second copy of `simple` that is unloaded and loaded again on purpose, streaming
completions from the LLM `smollm2` over `/v1/completions` (SSE), and `simple` over gRPC streams that
send as fast as the server takes requests, one reading at once and one reading slowly (each stream
cancelled after 10 s with requests in flight). Meanwhile `simple` and `minilm` are
reloaded with a changed config (new versions replace the old under traffic), `smollm2` is reloaded
now and then, and adapters are loaded and unloaded when the model serves them.

Every answer is classified: ok, deliberate (429/503 overload refusals, and the cycled model's or
adapter's requests while it is unloaded on purpose) or unexpected. The report gives per-class p50/p99
per minute and the server's RSS after warm-up.

    .venv/bin/python benchmarks/soak.py                      # 3 + 10 minutes -> benchmarks/results/soak.md
    .venv/bin/python benchmarks/soak.py --warmup-secs 90 --warmup-llm-reloads 1 --minutes 1 --out /tmp/soak
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples")]

from build_repository import build  # noqa: E402
from helpers.serverproc import ServerProcess  # noqa: E402
from llm_workloads import cpu_model  # noqa: E402

LLM, CYCLED, ADAPTERS = "smollm2", "simple_cycled", ("soak_a", "soak_b")
PROMPT = "Write one sentence about the sea."


def log(msg: str) -> None:
    print("[soak %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


# ---- recording ----------------------------------------------------------------------------
class Recorder:
    """Latencies by (traffic class, minute) and outcome counts; thread-safe, cheap per call."""

    def __init__(self, start: float):
        self.start, self.lock = start, threading.Lock()
        self.latencies: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
        self.outcomes: collections.Counter = collections.Counter()
        self.unexpected: list[str] = []

    def ok(self, kind: str, latency: float) -> None:
        minute = int((time.monotonic() - self.start) // 60)
        with self.lock:
            self.latencies[(kind, minute)].append(latency)
            self.outcomes[(kind, "ok")] += 1

    def deliberate(self, kind: str, why: str) -> None:
        with self.lock:
            self.outcomes[(kind, f"deliberate: {why}")] += 1

    def error(self, kind: str, message: str) -> None:
        with self.lock:
            self.outcomes[(kind, "unexpected")] += 1
            if len(self.unexpected) < 30:
                self.unexpected.append(f"{time.monotonic() - self.start:.0f}s {kind}: {message[:300]}")


class Windows:
    """When the cycled model and the adapters are unloaded on purpose (with a margin for requests
    already under way): their refusals then are deliberate."""

    def __init__(self):
        self.lock, self.down = threading.Lock(), {}

    def set(self, name: str, is_down: bool) -> None:
        with self.lock:
            self.down[name] = time.monotonic() if is_down else -time.monotonic()

    def is_down(self, name: str, margin: float = 2.0) -> bool:
        with self.lock:
            t = self.down.get(name)
        return t is not None and (t > 0 or time.monotonic() + t < margin)


def classify(rec: Recorder, windows: Windows, kind: str, model: str, status: str, message: str) -> None:
    if status in ("429", "503", "StatusCode.UNAVAILABLE", "StatusCode.RESOURCE_EXHAUSTED") and (
            "queue" in message or "retry" in message.lower()):
        rec.deliberate(kind, f"overload {status}")
    elif windows.is_down(model) and any(w in message for w in ("not ready", "not found", "unloading",
                                                                "no ready version", "does not exist",
                                                                "unknown", "is not loaded")):
        rec.deliberate(kind, f"{model} unloaded on purpose")
    else:
        rec.error(kind, f"{status} {message}")


# ---- traffic ------------------------------------------------------------------------------
def simple_worker(url: str, model: str, kind: str, rec: Recorder, windows: Windows, stop: threading.Event) -> None:
    client = grpcclient.InferenceServerClient(url)
    a, b = np.arange(16, dtype=np.int32)[None], np.full((1, 16), 3, np.int32)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            result = client.infer(model, inputs, client_timeout=60)
        except InferenceServerException as e:
            classify(rec, windows, kind, model, str(e.status()), e.message() or "")
            time.sleep(0.05)
            continue
        if not (result.as_numpy("OUTPUT0") == a + b).all():
            rec.error(kind, "wrong sum")
            continue
        rec.ok(kind, time.perf_counter() - t0)


def simple_request(i: int):
    """A raw `simple` ModelInferRequest (a + b, a - b of [1, 16] INT32) and the sum it must give."""
    from tritonclient.grpc import service_pb2

    a = np.full((1, 16), i % 1000, np.int32)
    msg = service_pb2.ModelInferRequest(model_name="simple", id=str(i))
    for name in ("INPUT0", "INPUT1"):
        msg.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        msg.raw_input_contents.append(a.tobytes())
    return msg, a + a


def stream_worker(url: str, rec: Recorder, windows: Windows, stop: threading.Event, read_delay: float) -> None:
    """One gRPC ModelStreamInfer stream at a time, its requests sent as fast as the server takes them
    (a flood: the server's per-stream bounds push back), its responses read every `read_delay` s (0: at
    once; a slow reader otherwise). Each stream lives 10 s, then is cancelled with requests in flight."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    kind = "stream_flood" if read_delay == 0 else "slow_reader"
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(url))
    counter = iter(range(1 << 62))
    while not stop.is_set():
        expected, sent_at, until = {}, {}, time.monotonic() + 10

        def requests(expected=expected, sent_at=sent_at, until=until):
            while not stop.is_set() and time.monotonic() < until:
                msg, total = simple_request(next(counter))
                expected[msg.id], sent_at[msg.id] = total, time.perf_counter()
                yield msg

        call = stub.ModelStreamInfer(requests())
        try:
            for response in call:
                if response.error_message:
                    classify(rec, windows, kind, "simple", "stream", response.error_message)
                else:
                    r = response.infer_response
                    out = np.frombuffer(r.raw_output_contents[0], np.int32).reshape(1, 16)
                    if not (out == expected.pop(r.id)).all():
                        rec.error(kind, "wrong sum")
                    else:
                        rec.ok(kind, time.perf_counter() - sent_at.pop(r.id))
                if read_delay:
                    time.sleep(read_delay)
                if time.monotonic() > until + 5:
                    break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                classify(rec, windows, kind, "simple", str(e.code()), e.details() or "")
        finally:
            call.cancel()


def minilm_worker(url: str, reference: np.ndarray, rec: Recorder, windows: Windows, stop: threading.Event) -> None:
    client = grpcclient.InferenceServerClient(url)
    inputs = minilm_inputs()
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            result = client.infer("minilm", inputs, outputs=[grpcclient.InferRequestedOutput("embeddings")],
                                  client_timeout=60)
        except InferenceServerException as e:
            classify(rec, windows, "minilm", "minilm", str(e.status()), e.message() or "")
            time.sleep(0.05)
            continue
        if not np.allclose(result.as_numpy("embeddings"), reference, atol=1e-4):
            rec.error("minilm", "wrong embeddings")
            continue
        rec.ok("minilm", time.perf_counter() - t0)


def minilm_inputs():
    ids = np.array([[101] + [7592 + i for i in range(14)] + [102]], np.int64)
    tensors = [grpcclient.InferInput("input_ids", list(ids.shape), "INT64"),
               grpcclient.InferInput("attention_mask", list(ids.shape), "INT64")]
    tensors[0].set_data_from_numpy(ids)
    tensors[1].set_data_from_numpy(np.ones_like(ids))
    return tensors


def llm_worker(base: str, index: int, rec: Recorder, windows: Windows, stop: threading.Event,
               adapters: bool) -> None:
    """Streaming completions; with adapters served, every other request names one as its model."""
    with httpx.Client(base_url=base, timeout=120) as http:
        n = 0
        while not stop.is_set():
            n += 1
            model = ADAPTERS[(index + n) % 2] if adapters and n % 2 else LLM
            kind = "llm_adapter" if model != LLM else "llm_stream"
            body = {"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0.7, "stream": True}
            t0 = time.perf_counter()
            try:
                with http.stream("POST", "/v1/completions", json=body) as response:
                    if response.status_code != 200:
                        message = response.read().decode(errors="replace")
                        classify(rec, windows, kind, model, str(response.status_code), message)
                        time.sleep(0.2)
                        continue
                    chunks, done = 0, False
                    for line in response.iter_lines():
                        if line == "data: [DONE]":
                            done = True
                        elif line.startswith("data: "):
                            if '"error"' in line:
                                classify(rec, windows, kind, model, "stream", line)
                                break
                            chunks += 1
            except httpx.HTTPError as e:
                rec.error(kind, f"{type(e).__name__}: {e}")
                continue
            if done and chunks:
                rec.ok(kind, time.perf_counter() - t0)
            elif not done:
                rec.error(kind, f"stream ended without [DONE] after {chunks} chunks")


# ---- churn --------------------------------------------------------------------------------
def churn(server, adapter_root: Path, rec: Recorder, windows: Windows, stop: threading.Event, adapters: bool,
          llm_reloads: list[float], until: float) -> None:
    """Reloads with a changed config (simple every 15 s, minilm every 45 s, the LLM at the
    `llm_reloads` times), unloads and reloads the cycled model every 30 s, swaps adapters every 20 s;
    starts nothing new after `until` s, so the end of the run measures memory at rest."""
    http = httpx.Client(base_url=f"http://{server.http_url}", timeout=600)
    configs = {name: json.loads(http.get(f"/v2/models/{name}/config").text) for name in ("simple", "minilm", LLM)}
    generation = 0
    start = time.monotonic()
    llm_reloads = list(llm_reloads)
    next_at = {"simple": 15, "minilm": 45, LLM: llm_reloads.pop(0) if llm_reloads else float("inf"), CYCLED: 30,
               "adapters": 20}
    while not stop.wait(0.5):
        now = time.monotonic() - start
        if now > until:
            continue
        for name in ("simple", "minilm", LLM):
            if now >= next_at[name]:
                generation += 1
                config = dict(configs[name])
                parameters = dict(config.get("parameters") or {})
                if name == LLM:  # its backend refuses unknown parameters: a harmless change of a known one
                    current = parameters.get("max_queue_size", {}).get("string_value", "64")
                    parameters["max_queue_size"] = {"string_value": "65" if current == "64" else "64"}
                else:
                    parameters["soak_generation"] = {"string_value": str(generation)}
                config["parameters"] = parameters
                configs[name] = config
                t0 = time.perf_counter()
                answer = http.post(f"/v2/repository/models/{name}/load",
                                   json={"parameters": {"config": json.dumps(config)}})
                outcome = "reloaded" if answer.status_code == 200 else f"reload failed {answer.status_code}"
                if answer.status_code != 200:
                    rec.error("churn", f"reload {name}: {answer.text[:200]}")
                rec.deliberate("churn", f"{name} {outcome}")
                log(f"{name}: {outcome} in {time.perf_counter() - t0:.1f} s")
                if name == LLM:
                    next_at[name] = llm_reloads.pop(0) if llm_reloads else float("inf")
                else:
                    next_at[name] += {"simple": 15, "minilm": 45}[name]
        if now >= next_at[CYCLED]:
            windows.set(CYCLED, True)
            if http.post(f"/v2/repository/models/{CYCLED}/unload").status_code != 200:
                rec.error("churn", f"unload {CYCLED} failed")
            stop.wait(3)
            if http.post(f"/v2/repository/models/{CYCLED}/load").status_code != 200:
                rec.error("churn", f"load {CYCLED} failed")
            windows.set(CYCLED, False)
            rec.deliberate("churn", f"{CYCLED} unloaded and loaded")
            next_at[CYCLED] += 30
        if adapters and now >= next_at["adapters"]:
            swap_adapter(http, adapter_root, rec, windows, ADAPTERS[int(now // 20) % 2])
            next_at["adapters"] += 20


def swap_adapter(http: httpx.Client, adapter_root: Path, rec: Recorder, windows: Windows, name: str) -> None:
    windows.set(name, True)
    base = f"/v2/repository/models/{LLM}/adapters/{name}"
    if http.post(f"{base}/unload").status_code != 200:
        rec.error("churn", f"unload adapter {name} failed")
    answer = http.post(f"{base}/load", json={"parameters": {"source": str(adapter_root / name)}})
    if answer.status_code != 200:
        rec.error("churn", f"load adapter {name}: {answer.text[:200]}")
    windows.set(name, False)
    rec.deliberate("churn", f"adapter {name} swapped")


def serves_adapters(server, adapter_root: Path) -> bool:
    """Whether the LLM's backend serves adapters: all of them load (and stay until swapped) or the
    first is refused as unsupported."""
    for name in ADAPTERS:
        answer = httpx.post(f"http://{server.http_url}/v2/repository/models/{LLM}/adapters/{name}/load",
                            json={"parameters": {"source": str(adapter_root / name)}}, timeout=120)
        if answer.status_code == 501 and name == ADAPTERS[0]:
            return False
        if answer.status_code != 200:
            raise SystemExit(f"loading adapter {name}: {answer.status_code} {answer.text}")
    return True


def write_adapters(root: Path) -> None:
    """Two small PEFT LoRA adapters (q_proj, v_proj; random B so they change the output) for SmolLM2,
    outside the model's folder: loaded at run time only, where the backend serves adapters."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    for name in ADAPTERS:
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"],
            "bias": "none", "task_type": "CAUSAL_LM", "base_model_name_or_path": "SmolLM2-135M-Instruct"}))
        tensors = {}
        for layer in range(30):
            for module, rows in (("q_proj", 576), ("v_proj", 192)):
                key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
                tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((8, 576)) * 0.02).astype(np.float32)
                tensors[f"{key}.lora_B.weight"] = (rng.standard_normal((rows, 8)) * 0.02).astype(np.float32)
        save_file(tensors, str(folder / "adapter_model.safetensors"))


# ---- memory -------------------------------------------------------------------------------
def rss_sampler(pid: int, start: float, samples: list, stop: threading.Event) -> None:
    while not stop.wait(5):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
        samples.append((time.monotonic() - start, kb / 1024))


# ---- report -------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1e3


def report(rec: Recorder, rss: list, meta: dict) -> tuple[str, dict]:
    kinds = sorted({k for k, _ in rec.latencies})
    minutes = sorted({m for _, m in rec.latencies})
    warm = meta["warmup_secs"]
    first_reload = meta["first_llm_reload"]
    early = statistics.median([mb for t, mb in rss if first_reload - 30 <= t < first_reload] or [float("nan")])
    after = [mb for t, mb in rss if t >= warm]
    first = statistics.median(after[:6]) if after else float("nan")
    last = statistics.median(after[-6:]) if after else float("nan")
    growth = (last - first) / first * 100 if after else float("nan")
    unexpected = sum(n for (k, outcome), n in rec.outcomes.items() if outcome == "unexpected")
    summary = {"unexpected_errors": unexpected, "rss_before_llm_reloads_mb": early, "rss_after_warmup_mb": first,
               "rss_end_mb": last,
               "rss_growth_pct": growth,
               "outcomes": {f"{k} | {o}": n for (k, o), n in sorted(rec.outcomes.items())},
               "p99_ms": {k: {m: percentile(rec.latencies[(k, m)], 0.99) for m in minutes if rec.latencies[(k, m)]}
                          for k in kinds}}
    lines = [f"# Soak ({meta['date']})", "",
             f"{warm:.0f} s of warm-up (traffic and churn, the LLM reloaded at {meta['warmup_reloads']} s), then "
             f"{meta['minutes']:g} minutes measured, {meta['machine']}; server and client threads on the same 2 cores "
             f"(latencies include the client's own GIL contention). Load average (5 min) before/after: "
             f"{meta['load'][0]:.1f} / {meta['load'][1]:.1f}. Client threads: {meta['threads']}. "
             f"Adapters swapped: {meta['adapters']}. No reload or unload starts in the last {meta['quiet_secs']:.0f} s "
             "(traffic goes on), so the end measures memory at rest.", "",
             f"**Unexpected errors: {unexpected}.** RSS after the {warm:.0f} s warm-up {first:.0f} MB, at the end "
             f"{last:.0f} MB: **{growth:+.1f}%** ({last - first:+.0f} MB; goal < 5%). In the 30 s before the first "
             f"LLM reload: {early:.0f} MB (end {(last - early) / early * 100:+.1f}%).", "",
             "## Outcomes", "", "| traffic | outcome | count |", "|---|---|---|"]
    lines += [f"| {k} | {o} | {n} |" for (k, o), n in sorted(rec.outcomes.items())]
    lines += ["", "## Latency per minute (ms, p50 / p99, ok answers)", "",
              "| minute | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
    for m in minutes:
        cells = []
        for k in kinds:
            values = rec.latencies.get((k, m))
            cells.append(f"{percentile(values, 0.5):.1f} / {percentile(values, 0.99):.1f} ({len(values)})"
                         if values else "–")
        lines.append(f"| {m + 1} | " + " | ".join(cells) + " |")
    lines += ["", "## Server RSS (MB, every 30 s)", "", " ".join(f"{t:.0f}s:{mb:.0f}" for t, mb in rss[::6])]
    if rec.unexpected:
        lines += ["", "## Unexpected errors (first 30)", ""] + [f"- {u}" for u in rec.unexpected]
    return "\n".join(lines) + "\n", summary


# ---- main ---------------------------------------------------------------------------------
def build_repo(repo: Path) -> None:
    build(repo, ["simple", "minilm", LLM])
    llm_config = repo / LLM / "config.pbtxt"
    if "max_loras" not in llm_config.read_text():  # the example serves no adapters; the soak swaps two
        llm_config.write_text(llm_config.read_text() + 'parameters { key: "max_loras" value { string_value: "2" } }\n')
    if not (repo / CYCLED).exists():
        shutil.copytree(repo / "simple", repo / CYCLED)
        config = (repo / CYCLED / "config.pbtxt").read_text().replace('name: "simple"', f'name: "{CYCLED}"')
        (repo / CYCLED / "config.pbtxt").write_text(config)


def llm_reloads(args) -> list[float]:
    """When the LLM is reloaded (seconds from the start): evenly inside the warm-up (the last one
    60 s before its end), then every --llm-reload-secs."""
    n, warm = args.warmup_llm_reloads, args.warmup_secs
    times = [(warm - 60) * (i + 1) / n for i in range(n)] if n else []
    t = warm + args.llm_reload_secs
    while t < warm + args.minutes * 60:
        times.append(t)
        t += args.llm_reload_secs
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="measured, after the warm-up")
    parser.add_argument("--warmup-secs", type=float, default=180.0,
                        help="traffic and churn before the RSS baseline, with --warmup-llm-reloads LLM reloads in it")
    parser.add_argument("--warmup-llm-reloads", type=int, default=2,
                        help="a reload's allocator arenas and caches settle over the first few: in a reload loop "
                             "RSS grew +157, +54, +35, +8 MB with Python objects and tensors flat")
    parser.add_argument("--simple-threads", type=int, default=24)
    parser.add_argument("--minilm-threads", type=int, default=16)
    parser.add_argument("--cycled-threads", type=int, default=4)
    parser.add_argument("--llm-threads", type=int, default=8)
    parser.add_argument("--stream-floods", type=int, default=1,
                        help="gRPC streams sending `simple` requests as fast as the server takes them")
    parser.add_argument("--slow-readers", type=int, default=1,
                        help="gRPC streams that flood requests but read a response only every 0.1 s")
    parser.add_argument("--llm-reload-secs", type=float, default=200.0)
    parser.add_argument("--quiet-secs", type=float, default=90.0,
                        help="no reloads or unloads start in the last this many seconds (traffic goes on)")
    parser.add_argument("--repo", type=Path, default=Path("/tmp/bench/soak_repo"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log(f"building the repository in {args.repo}")
    build_repo(args.repo)
    adapter_root = args.repo.parent / "soak_adapters"
    write_adapters(adapter_root)
    load_before = os.getloadavg()[1]
    with ServerProcess([args.repo], "--model-control-mode", "explicit", "--load-model", "*",
                       "--lora-adapter-root", str(adapter_root), env={"HF_HUB_OFFLINE": "1"}, timeout=900) as server:
        adapters = serves_adapters(server, adapter_root)
        log(f"serving (pid {server.proc.pid}); adapters served by {LLM}: {adapters}")
        if not httpx.get(f"http://{server.http_url}/v2/models/{LLM}/ready", timeout=30).status_code == 200:
            raise SystemExit(f"{LLM} did not load:\n{server.log()[-3000:]}")
        reference = grpcclient.InferenceServerClient(server.grpc_url).infer("minilm", minilm_inputs()).as_numpy(
            "embeddings")
        start = time.monotonic()
        rec, windows, stop, rss = Recorder(start), Windows(), threading.Event(), []
        base = f"http://{server.http_url}"
        workers = ([(simple_worker, server.grpc_url, "simple", "simple")] * args.simple_threads
                   + [(simple_worker, server.grpc_url, CYCLED, "cycled")] * args.cycled_threads)
        threads = [threading.Thread(target=fn, args=(url, model, kind, rec, windows, stop), daemon=True)
                   for fn, url, model, kind in workers]
        threads += [threading.Thread(target=minilm_worker, args=(server.grpc_url, reference, rec, windows, stop),
                                     daemon=True) for _ in range(args.minilm_threads)]
        threads += [threading.Thread(target=llm_worker, args=(base, i, rec, windows, stop, adapters), daemon=True)
                    for i in range(args.llm_threads)]
        threads += [threading.Thread(target=stream_worker, args=(server.grpc_url, rec, windows, stop, delay),
                                     daemon=True)
                    for delay in [0.0] * args.stream_floods + [0.1] * args.slow_readers]
        end = args.warmup_secs + args.minutes * 60
        threads += [threading.Thread(target=churn, args=(server, adapter_root, rec, windows, stop, adapters,
                                                         llm_reloads(args), end - args.quiet_secs), daemon=True),
                    threading.Thread(target=rss_sampler, args=(server.proc.pid, start, rss, stop), daemon=True)]
        for t in threads:
            t.start()
        deadline = start + end
        while time.monotonic() < deadline:
            time.sleep(min(30, max(0.1, deadline - time.monotonic())))
            with rec.lock:
                oks = sum(n for (k, o), n in rec.outcomes.items() if o == "ok")
                bad = sum(n for (k, o), n in rec.outcomes.items() if o == "unexpected")
            log(f"{time.monotonic() - start:.0f} s: {oks} ok, {bad} unexpected, RSS {rss[-1][1] if rss else 0:.0f} MB")
        stop.set()
        for t in threads:
            t.join(150)
        exit_code = server.stop()
    meta = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "minutes": args.minutes, "machine": f"{cpu_model()}, shared, CPU only",
            "load": (load_before, os.getloadavg()[1]), "warmup_secs": args.warmup_secs, "adapters": adapters,
            "warmup_reloads": ", ".join(f"{t:.0f}" for t in llm_reloads(args)[:args.warmup_llm_reloads]),
            "first_llm_reload": (llm_reloads(args) or [float("inf")])[0],
            "quiet_secs": args.quiet_secs,
            "threads": f"simple {args.simple_threads}, {CYCLED} {args.cycled_threads}, minilm {args.minilm_threads}, "
                       f"LLM streams {args.llm_threads}, gRPC stream floods {args.stream_floods}, "
                       f"slow readers {args.slow_readers}"}
    text, summary = report(rec, rss, meta)
    text += f"\nServer exit code after SIGTERM: {exit_code}.\n"
    (args.out / "soak.md").write_text(text)
    (args.out / "soak.json").write_text(json.dumps(summary | {"meta": meta, "rss": rss}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
