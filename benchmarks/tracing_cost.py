"""What tracing (trace_rate=1) costs a `simple` request on the HTTP infer path, measured in-process and
paired: one server's ASGI app driven directly by 16 tasks (no sockets, no wrk), rounds alternating
tracing off and on (`Tracing.update`, what `/v2/trace/setting` calls) in the same process, reported as
the median of the paired differences in CPU µs a request.

`observability.py` measures the figure users see (req/s over sockets, one server per configuration),
but a traced server's CPU a request varies by several µs from one process to the next; pairing
rounds in one process does better (runs of 10 pairs here: +6.6, +7.0, +7.4 µs with spans recorded in
Python; +4.0, +4.3, +3.3 with the C recorder), enough to tell whether a change to the traced path helps by a
µs or more. Each request returns to the event loop, as
over sockets: a loop that never gets control never exports, and the spans would be dropped instead.
Spans go to a real exporter process and an OTLP sink in another process (their CPU is not counted; a
sink thread in this process would be, and would take the GIL from the loop).

    .venv/bin/python benchmarks/tracing_cost.py                 # 10 pairs of 16,000 requests
    .venv/bin/python benchmarks/tracing_cost.py --pairs 20 --requests 32000
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "benchmarks")]

from build_repository import build  # noqa: E402
from host_load import INFER_PATH, json_body  # noqa: E402

from modelplex.core.settings import ServerConfig  # noqa: E402
from modelplex.http.app import create_http_app  # noqa: E402
from modelplex.observability.tracing import TraceConfig  # noqa: E402
from modelplex.server.assembly import Server  # noqa: E402

TASKS = 16
SINK = ("import sys; sys.path.insert(0, sys.argv[1]); from observability import OtlpSink; sink = OtlpSink(); "
        "print(sink.url, flush=True); sys.stdin.read(); print(sink.num_posts, flush=True)")
BODY = json_body()  # the body wrk sends in observability.py
SCOPE = {"type": "http", "method": "POST", "path": INFER_PATH,
         "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                     (b"content-length", str(len(BODY)).encode())]}


async def measure(repo: Path, sink_url: str, pairs: int, requests: int) -> dict:
    settings = ServerConfig(model_repositories=[repo], host="127.0.0.1", http_port=0, grpc_port=0,
                            allow_metrics=False, model_control_mode="explicit", load_models=["simple"],
                            trace=TraceConfig(level="OFF", rate=1, url=sink_url))
    server = Server(settings)
    await server.start()
    app = create_http_app(server.dataplane, server.settings)
    tracing = server.dataplane.tracing
    statuses = []

    async def receive():
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def client(n: int):
        for _ in range(n):
            await app(dict(SCOPE), receive, send)
            await asyncio.sleep(0)  # back to the loop, as a server between requests: `simple` never waits

    async def cpu_per_request(traced: bool) -> float:
        tracing.update({"trace_level": "TIMESTAMPS" if traced else "OFF"})
        started = time.process_time()
        await asyncio.gather(*(client(requests // TASKS) for _ in range(TASKS)))
        return (time.process_time() - started) / (requests // TASKS * TASKS) * 1e6

    try:
        await cpu_per_request(True)  # warm-up: both paths run, the exporter process starts
        await cpu_per_request(False)
        rows = {"off": [], "on": []}
        for i in range(pairs):
            for traced in ((True, False) if i % 2 else (False, True)):  # the order flips every pair
                rows["on" if traced else "off"].append(await cpu_per_request(traced))
        tracing.flush()
    finally:
        await server.stop()
    if set(statuses) != {200}:
        raise SystemExit(f"not every request answered 200: {sorted(set(statuses))}")
    deltas = [on - off for on, off in zip(rows["on"], rows["off"])]
    return {"off_us": statistics.median(rows["off"]), "on_us": statistics.median(rows["on"]),
            "delta_us": statistics.median(deltas), "deltas_us": deltas, "spans_dropped": tracing.num_dropped}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--requests", type=int, default=16000, help="requests a round")
    args = p.parse_args(argv)
    repo = Path(tempfile.mkdtemp(prefix="bench-tracing-cost-")) / "repo"
    build(repo, ["simple"])
    sink = subprocess.Popen([sys.executable, "-c", SINK, str(ROOT / "benchmarks")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        r = asyncio.run(measure(repo, sink.stdout.readline().strip(), args.pairs, args.requests))
    finally:
        num_posts = sink.communicate("")[0].strip()
    print(f"tracing off {r['off_us']:.2f} µs a request, rate=1 {r['on_us']:.2f}; paired difference "
          f"{r['delta_us']:+.2f} µs ({r['delta_us'] / r['off_us'] * 100:+.1f}%), pairs: "
          f"{' '.join(f'{d:+.1f}' for d in r['deltas_us'])}; spans dropped {r['spans_dropped']}, "
          f"OTLP posts received {num_posts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
