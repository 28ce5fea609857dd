"""Batching benchmark: minilm requests/s at concurrency 64 with and without dynamic batching, and the
per-step overhead of a 3-step ensemble over `simple` against calling `simple` directly (p50).

One server serves minilm in three layouts (instances x ORT intra-op threads: 1x1, 2x1, 1x2), each
as `minilm_plain_<layout>` (no batching) and `minilm_batched_<layout>` (the same model with
`dynamic_batching`), plus `simple` and the ensembles `chain1` (one `simple` step) and `chain3`
(three). Load comes from `tritonclient.grpc` in client threads (one client each), checked answers
only. Each round runs every cell, the order reversed every other round, so all see the same machine
noise; ratios are taken within a round (same layout, and best layout against best layout) and the
report gives medians over rounds.

    .venv/bin/python benchmarks/batching.py                 # 3 rounds -> benchmarks/results/batching.md
    .venv/bin/python benchmarks/batching.py --quick         # 1 round, short, report under /tmp/bench
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples")]

from build_repository import build, ensemble_config  # noqa: E402
from helpers.serverproc import ServerProcess  # noqa: E402
from llm_workloads import cpu_model  # noqa: E402

SEQUENCE = 16  # tokens per minilm request
BATCHING = "dynamic_batching { }\n"  # Triton's default: batch what is queued, never wait
LAYOUTS = [(1, 1), (2, 1), (1, 2)]  # (instances, ORT intra-op threads per instance)


def layout_config(instances: int, threads: int) -> str:
    return (f'instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n'
            f'parameters {{ key: "intra_op_thread_count" value {{ string_value: "{threads}" }} }}\n')


def layout_name(layout: tuple[int, int]) -> str:
    return f"{layout[0]}x{layout[1]}"
CHAIN_STEPS = [  # a+b, a-b -> 2a, 2b -> 2a+2b, 2a-2b
    ({"INPUT0": "INPUT0", "INPUT1": "INPUT1"}, {"OUTPUT0": "S", "OUTPUT1": "D"}),
    ({"INPUT0": "S", "INPUT1": "D"}, {"OUTPUT0": "A2", "OUTPUT1": "B2"}),
    ({"INPUT0": "A2", "INPUT1": "B2"}, {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"}),
]


def log(msg: str) -> None:
    print("[batching %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def build_repo(out: Path) -> None:
    build(out, ["simple", "minilm"])
    base = (out / "minilm" / "config.pbtxt").read_text()
    for layout in LAYOUTS:
        for kind, extra in (("plain", ""), ("batched", BATCHING)):
            name = f"minilm_{kind}_{layout_name(layout)}"
            if not (out / name).exists():
                shutil.copytree(out / "minilm", out / name)
            config = base.replace('name: "minilm"', f'name: "{name}"') + layout_config(*layout) + extra
            (out / name / "config.pbtxt").write_text(config)
    for name, steps in (("chain1", [(CHAIN_STEPS[0][0], {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"})]),
                        ("chain3", CHAIN_STEPS)):
        (out / name / "1").mkdir(parents=True, exist_ok=True)
        (out / name / "config.pbtxt").write_text(ensemble_config(name, steps))


# ---- minilm throughput --------------------------------------------------------------------
def minilm_inputs():
    ids = np.array([[101] + [7592 + i for i in range(SEQUENCE - 2)] + [102]], np.int64)
    tensors = [grpcclient.InferInput("input_ids", list(ids.shape), "INT64"),
               grpcclient.InferInput("attention_mask", list(ids.shape), "INT64")]
    tensors[0].set_data_from_numpy(ids)
    tensors[1].set_data_from_numpy(np.ones_like(ids))
    return tensors


def throughput(url: str, model: str, concurrency: int, seconds: float, warmup: float) -> dict:
    """Closed loop: `concurrency` threads, each sending its next request when the last one answers.
    At c=64 one answer can take a second, so answers are counted by when they arrive."""
    reference = grpcclient.InferenceServerClient(url).infer("minilm", minilm_inputs()).as_numpy("embeddings")
    start_at = time.monotonic() + 0.5
    begin, end = start_at + warmup, start_at + warmup + seconds
    counts, errors = [0] * concurrency, []

    def worker(i: int) -> None:
        client, inputs = grpcclient.InferenceServerClient(url), minilm_inputs()
        time.sleep(max(0.0, start_at - time.monotonic()))
        while time.monotonic() < end:
            result = client.infer(model, inputs)
            if begin <= time.monotonic() <= end:  # answers inside the window, whenever they were asked
                counts[i] += 1
            if not np.allclose(result.as_numpy("embeddings"), reference, atol=1e-4):
                errors.append("wrong embeddings")
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{model}: {errors[0]}")
    return {"model": model, "requests": sum(counts), "rps": sum(counts) / seconds}


def counters(url: str, model: str) -> dict:
    stats = grpcclient.InferenceServerClient(url).get_inference_statistics(model, as_json=True)["model_stats"][0]
    return {"inferences": int(stats.get("inference_count", 0)), "executions": int(stats.get("execution_count", 0)),
            "compute_ns": sum(int(b["compute_infer"].get("ns", 0)) for b in stats.get("batch_stats", []))}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used (from /proc): steadier than wall time on a busy host."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ort_ceiling(model_file: Path, threads: int, rounds: int = 2) -> dict:
    """onnxruntime alone (this process, `threads` intra-op threads): ms per request at batch 1 and
    batch 32, the most batching could gain on this machine at this moment."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(model_file), options)
    best = {1: float("inf"), 32: float("inf")}
    for _ in range(rounds):
        for batch, repeats in ((1, 32), (32, 1)):
            ids = np.full((batch, SEQUENCE), 2000, np.int64)
            feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            session.run(None, feeds)
            t0 = time.perf_counter()
            for _ in range(repeats):
                session.run(None, feeds)
            best[batch] = min(best[batch], (time.perf_counter() - t0) / repeats / batch * 1e3)
    return {"threads": threads, "ort_b1_ms": best[1], "ort_b32_ms": best[32]}


# ---- ensemble overhead --------------------------------------------------------------------
def simple_inputs(a: np.ndarray, b: np.ndarray):
    tensors = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    tensors[0].set_data_from_numpy(a)
    tensors[1].set_data_from_numpy(b)
    return tensors


def latencies(fn, num_requests: int) -> list[float]:
    for _ in range(50):
        fn()
    out = []
    for _ in range(num_requests):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def server_ns_per_request(client, model: str, before: dict | None = None) -> tuple[dict, float]:
    """(statistics now, mean in-server ns per successful request since `before`)."""
    now = client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_stats"]["success"]
    count, ns = int(now.get("count", 0)), int(now.get("ns", 0))
    if before is None:
        return {"count": count, "ns": ns}, 0.0
    return {"count": count, "ns": ns}, (ns - before["ns"]) / max(1, count - before["count"])


def ensemble_overhead(url: str, num_requests: int) -> dict:
    """p50s (ms) of: one direct `simple` call, the client calling the 3 steps itself, `chain1`, `chain3`.

    overhead per step = (p50(chain3) - p50(simple) - 2 * W) / 3, where W is one step's in-server
    time in `simple` itself (its statistics while chain3 runs): what the ensemble adds beyond the
    extra steps' own work, spread over its 3 steps."""
    client = grpcclient.InferenceServerClient(url)
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 3, np.int32)
    expect = (2 * a + 2 * b, 2 * a - 2 * b)

    def direct_chain():
        s = client.infer("simple", simple_inputs(a, b))
        t = client.infer("simple", simple_inputs(s.as_numpy("OUTPUT0"), s.as_numpy("OUTPUT1")))
        return client.infer("simple", simple_inputs(t.as_numpy("OUTPUT0"), t.as_numpy("OUTPUT1")))

    final = client.infer("chain3", simple_inputs(a, b))
    assert (final.as_numpy("OUTPUT0") == expect[0]).all() and (final.as_numpy("OUTPUT1") == expect[1]).all()
    assert (direct_chain().as_numpy("OUTPUT0") == expect[0]).all()
    p50 = {"simple": statistics.median(latencies(lambda: client.infer("simple", simple_inputs(a, b)), num_requests)),
           "direct_chain3": statistics.median(latencies(direct_chain, num_requests // 3)),
           "chain1": statistics.median(latencies(lambda: client.infer("chain1", simple_inputs(a, b)), num_requests))}
    before, _ = server_ns_per_request(client, "simple")
    p50["chain3"] = statistics.median(latencies(lambda: client.infer("chain3", simple_inputs(a, b)), num_requests))
    _, step_ns = server_ns_per_request(client, "simple", before)
    row = {k: v * 1e3 for k, v in p50.items()}
    row["step_work"] = step_ns / 1e6
    row["overhead_per_step"] = (row["chain3"] - row["simple"] - 2 * row["step_work"]) / 3
    row["marginal_step"] = (row["chain3"] - row["chain1"]) / 2
    return row


# ---- report -------------------------------------------------------------------------------
def med(values) -> float:
    return statistics.median(values)


def report(runs: list[dict], meta: dict) -> str:
    tp = [r for r in runs if r["kind"] == "throughput"]
    ov = [r for r in runs if r["kind"] == "ensemble"]
    rounds = sorted({r["round"] for r in tp})
    by = {(r["round"], r["model"]): r for r in tp}
    names = [layout_name(layout) for layout in LAYOUTS]

    def rps(n, kind, name):
        return by[(n, f"minilm_{kind}_{name}")]["rps"]

    def spread(values, fmt="{:.0f}"):
        return f"{fmt.format(med(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"

    lines = [f"# Dynamic batching and ensemble overhead ({meta['date']})", "",
             f"{meta['machine']}. One modelplex server; load from `tritonclient.grpc` threads on the same machine. "
             f"{len(rounds)} round(s); medians over rounds, (min–max). Other tenants' load (5-min load average "
             f"before/after): {meta['load'][0]:.1f} / {meta['load'][1]:.1f} on 2 cores.", "",
             f"## minilm at concurrency {meta['concurrency']} (gRPC, {SEQUENCE} tokens, batch 1 per request, "
             f"{meta['seconds']:.0f} s per cell)", "",
             "Layout = instances x ORT intra-op threads per instance.", "",
             "| layout | unbatched req/s | batched req/s | batched / unbatched | inferences per call (batched) "
             "| server CPU per inference, unbatched / batched (ms) |", "|---|---|---|---|---|---|"]
    for name in names:
        plain = [rps(n, "plain", name) for n in rounds]
        batched = [rps(n, "batched", name) for n in rounds]
        ratio = [rps(n, "batched", name) / rps(n, "plain", name) for n in rounds]
        per_call = [by[(n, f"minilm_batched_{name}")]["per_call"] for n in rounds]
        cpu = [by[(n, f"minilm_plain_{name}")]["cpu_ms"] for n in rounds]
        cpu_b = [by[(n, f"minilm_batched_{name}")]["cpu_ms"] for n in rounds]
        lines.append(f"| {name} | {spread(plain)} | {spread(batched)} | {spread(ratio, '{:.2f}')}× "
                     f"| {med(per_call):.1f} | {med(cpu):.1f} / {med(cpu_b):.1f} |")
    best = [max(rps(n, "batched", x) for x in names) / max(rps(n, "plain", x) for x in names) for n in rounds]
    same = [rps(n, "batched", names[0]) / rps(n, "plain", names[0]) for n in rounds]
    ceiling = [r for r in runs if r["kind"] == "ceiling"]
    lines += ["", f"**Batched / unbatched, same layout (1x1): {med(same):.2f}×** (per round: "
              f"{', '.join(f'{r:.2f}' for r in same)}); **best batched layout / best unbatched layout: "
              f"{med(best):.2f}×** (per round: {', '.join(f'{r:.2f}' for r in best)}); goal ≥ 2×.", "",
              "Ceiling, onnxruntime alone in the benchmark process between rounds (ms per request):", "",
              "| ORT threads | batch 1 | batch 32 | most batching can gain |", "|---|---|---|---|"]
    for threads in sorted({r["threads"] for r in ceiling}):
        rows = [r for r in ceiling if r["threads"] == threads]
        gains = [r["ort_b1_ms"] / r["ort_b32_ms"] for r in rows]
        lines.append(f"| {threads} | {med([r['ort_b1_ms'] for r in rows]):.1f} | {med([r['ort_b32_ms'] for r in rows]):.1f} "
                     f"| {med(gains):.2f}× ({', '.join(f'{g:.2f}' for g in gains)}) |")
    lines += ["",
              "## Ensemble overhead (gRPC, concurrency 1, p50 latency in ms)", "",
              "| direct `simple` | client calls the 3 steps | `chain1` ensemble | `chain3` ensemble "
              "| one step's work in `simple` (W) | one more step: (chain3 − chain1) / 2 | overhead per step |",
              "|---|---|---|---|---|---|---|"]
    keys = ("simple", "direct_chain3", "chain1", "chain3", "step_work", "marginal_step", "overhead_per_step")
    lines.append("| " + " | ".join(f"{med([r[k] for r in ov]):.3f}" for k in keys) + " |")
    lines += ["", "overhead per step = (p50(chain3) − p50(simple) − 2·W) / 3: what the ensemble adds beyond the "
              "two extra steps' own work, spread over its three steps (goal < 1 ms). W is the mean in-server time "
              "of a `simple` request while chain3 runs (the steps go through `simple`'s own request path). "
              "\"One more step\" is the p50 cost of a step inside an ensemble, its own work included.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency-requests", type=int, default=1500)
    parser.add_argument("--quick", action="store_true", help="1 round, 3 s cells, report under /tmp/bench")
    parser.add_argument("--repo", type=Path, default=Path("/tmp/bench/batching_repo"))
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.warmup, args.latency_requests = 1, 3.0, 1.0, 300
    out = Path("/tmp/bench") if args.quick else ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    log("building the repository in %s" % args.repo)
    build_repo(args.repo)
    runs = []
    load_before = os.getloadavg()[1]
    with ServerProcess([args.repo], env={"MODELPLEX_PLUGINS": "onnx,ensemble"}) as server:
        models = [f"minilm_{kind}_{layout_name(layout)}" for layout in LAYOUTS for kind in ("plain", "batched")]
        for n in range(args.rounds):
            for model in models[:: 1 if n % 2 == 0 else -1]:
                before, cpu_before = counters(server.grpc_url, model), cpu_seconds(server.proc.pid)
                row = throughput(server.grpc_url, model, args.concurrency, args.seconds, args.warmup)
                after, cpu_after = counters(server.grpc_url, model), cpu_seconds(server.proc.pid)
                inferences = max(1, after["inferences"] - before["inferences"])
                row["cpu_ms"] = (cpu_after - cpu_before) / inferences * 1e3
                row["per_call"] = inferences / max(1, after["executions"] - before["executions"])
                row["compute_ms"] = (after["compute_ns"] - before["compute_ns"]) / inferences / 1e6
                runs.append({"kind": "throughput", "round": n, **row})
                log("round %d %s: %.0f req/s, %.1f inferences per call, %.1f ms compute and %.1f ms server CPU "
                    "per inference" % (n, model, row["rps"], row["per_call"], row["compute_ms"], row["cpu_ms"]))
            for threads in (1, 2):
                row = ort_ceiling(args.repo / "minilm" / "1" / "model.onnx", threads)
                runs.append({"kind": "ceiling", "round": n, **row})
                log("round %d onnxruntime alone: %s" % (n, {k: round(v, 2) for k, v in row.items()}))
            row = ensemble_overhead(server.grpc_url, args.latency_requests)
            runs.append({"kind": "ensemble", "round": n, **row})
            log("round %d ensemble: %s" % (n, {k: round(v, 3) for k, v in row.items()}))
    meta = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{cpu_model()}, shared, CPU only", "concurrency": args.concurrency,
            "load": (load_before, os.getloadavg()[1]),
            "seconds": args.seconds}
    (out / "batching.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    (out / "batching.md").write_text(report(runs, meta))
    print(report(runs, meta))


if __name__ == "__main__":
    main()
