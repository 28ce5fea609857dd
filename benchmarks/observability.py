"""What observability costs on the hot path: requests/s of `simple` (HTTP JSON, wrk) with tracing at
trace_rate=1 (spans exported over OTLP/HTTP to a local sink) and with metrics scraped every second,
each against a plain server (tracing off, no metrics port), in the same run.

Each configuration has its own server, all started once; every round measures each one back to back
(the order rotating), so a round's servers share the machine's noise. Reported: the median req/s over
rounds and the median of the per-round ratios to the plain server, plus server CPU per request.

    .venv/bin/python benchmarks/observability.py                 # 5 rounds x 5 s
    .venv/bin/python benchmarks/observability.py --rounds 3 --seconds 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples"), str(ROOT / "benchmarks")]

from build_repository import build  # noqa: E402
from host_servers import cpu_seconds  # noqa: E402
from host_wrk import run_wrk, write_lua_scripts  # noqa: E402
from serverproc import ServerProcess  # noqa: E402


class OtlpSink:
    """An OTLP/HTTP collector that accepts and counts (not decodes) what it receives."""

    def __init__(self):
        outer = self
        self.num_posts = self.num_bytes = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                outer.num_bytes += len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                outer.num_posts += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1/traces"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


class Scraper:
    """Scrapes /metrics every `interval` s while the server is measured (as Prometheus would)."""

    def __init__(self, url: str, interval: float = 1.0):
        self.url, self.interval, self.num_scrapes = url, interval, 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self._stop.wait(self.interval):
            httpx.get(self.url).raise_for_status()
            self.num_scrapes += 1

    def stop(self):
        self._stop.set()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--baseline-tree", type=Path,
                   help="a checkout of the code before tracing (git worktree): adds its plain server, to show "
                        "what tracing off costs")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-observability-"))
    repo = work / "repo"
    build(repo, ["simple"])
    script = write_lua_scripts(work / "lua")["json"]
    sink = OtlpSink()
    configs = {
        "plain": ["--allow-metrics", "false"],
        "tracing rate=1": ["--allow-metrics", "false", "--trace-config", "level=TIMESTAMPS",
                           "--trace-config", "rate=1", "--trace-config", f"opentelemetry,url={sink.url}",
                           "--trace-config", "opentelemetry,bsp_schedule_delay=200"],
        "tracing rate=100": ["--allow-metrics", "false", "--trace-config", "level=TIMESTAMPS",
                             "--trace-config", "rate=100", "--trace-config", f"opentelemetry,url={sink.url}"],
        "metrics, scraped 1/s": [],
    }
    env = {name: None for name in configs}
    if args.baseline_tree is not None:
        folders = ["platform", "backends/onnx", "backends/python", "ensembles"]
        configs["plain, baseline tree"] = configs["plain"]
        env["plain, baseline tree"] = {"PYTHONPATH": ":".join(str(args.baseline_tree / f) for f in folders)}
    servers = {name: ServerProcess([repo], *flags, env=env[name]).start() for name, flags in configs.items()}
    results = {name: [] for name in configs}
    try:
        for r in range(args.rounds):
            names = list(configs)[r % len(configs):] + list(configs)[:r % len(configs)]
            for name in names:
                server = servers[name]
                scraper = Scraper(server.metrics_url) if "metrics" in name else None
                result = run_wrk(f"http://{server.http_url}", script, args.connections, args.seconds, warmup=1,
                                 server_cpu=lambda s=server: cpu_seconds(s.proc.pid), threads=1)
                if scraper:
                    scraper.stop()
                    result["num_scrapes"] = scraper.num_scrapes
                assert result["errors"] == 0, result
                results[name].append(result)
                print(f"round {r + 1} {name:22s} {result['rps']:8.0f} req/s", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    print(json.dumps({"otlp_posts": sink.num_posts, "otlp_bytes": sink.num_bytes}))
    plain = results["plain"]
    print(f"\n{'configuration':22s} {'req/s (median)':>15s} {'vs plain (median of rounds)':>28s} {'server CPU us/req':>18s}")
    for name, runs in results.items():
        ratios = [run["rps"] / base["rps"] for run, base in zip(runs, plain)]
        cpu = statistics.median(run["server_cpu_s"] / run["ok"] * 1e6 for run in runs)
        print(f"{name:22s} {statistics.median(r['rps'] for r in runs):15.0f} "
              f"{(statistics.median(ratios) - 1) * 100:+27.1f}% {cpu:18.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
