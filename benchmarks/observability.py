"""What observability costs on the hot path: requests/s of `simple` with tracing at trace_rate=1 and
trace_rate=100 (spans exported over OTLP/HTTP to a local collector) and with metrics scraped every
second, each against a plain server (tracing off, no metrics port), in the same run.

Each configuration has its own server, all started once. Every round measures each one back to back
(the order rotating), over HTTP (JSON body, `wrk -t1 -c16`) and over gRPC (`tritonclient.grpc` from
16 threads, `host_load.py`), so a round's servers share the machine's noise. Reported: the median
req/s over rounds, the median of the per-round ratios to the plain server, and CPU per request of
the server process and of its trace exporter process (from /proc, around each measured run), with
the load average of the machine.

    .venv/bin/python benchmarks/observability.py                   # 5 rounds x 5 s -> results/observability.md
    .venv/bin/python benchmarks/observability.py --rounds 2 --seconds 3 --out /tmp/obs.md
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks"
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples"), str(HERE)]

from build_repository import build  # noqa: E402
from helpers.serverproc import ServerProcess  # noqa: E402
from host_servers import _CLOCK_TICKS, descendants  # noqa: E402
from host_wrk import run_wrk, write_lua_scripts  # noqa: E402


class OtlpSink:
    """An OTLP/HTTP collector that accepts and counts (not decodes) what it receives."""

    def __init__(self):
        outer = self
        self.num_posts = self.num_bytes = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real collector

            def do_POST(self):
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


def cpu_split(pid: int) -> tuple[float, float]:
    """CPU seconds of the server process itself and of its child processes (the trace exporter)."""
    own = children = 0.0
    for p in descendants(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        if p == pid:
            own = seconds
        else:
            children += seconds
    return own, children


def run_grpc(server: ServerProcess, seconds: float, threads: int) -> dict:
    """host_load.py's gRPC client threads (its own process); CPU read around the measured window."""
    cmd = [sys.executable, str(HERE / "host_load.py"), "grpc", "--url", server.grpc_url, "--concurrency",
           str(threads), "--seconds", str(seconds), "--warmup", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    threading.Event().wait(1.0)  # the warm-up
    before = cpu_split(server.proc.pid)
    out, _ = proc.communicate(timeout=seconds + 120)
    after = cpu_split(server.proc.pid)
    result = json.loads(out.strip().splitlines()[-1])
    result["cpu"] = (after[0] - before[0], after[1] - before[1])
    result["num_finished"] = result["ok"] + result["errors"]  # those of the measured window only
    return result


def run_http(server: ServerProcess, script: Path, seconds: float, connections: int) -> dict:
    box = {}

    def server_cpu():
        now = cpu_split(server.proc.pid)
        if "before" not in box:
            box["before"] = now
        return sum(now)

    result = run_wrk(f"http://{server.http_url}", script, connections, seconds, warmup=1,
                     server_cpu=server_cpu, threads=1)
    after = cpu_split(server.proc.pid)
    result["cpu"] = (after[0] - box["before"][0], after[1] - box["before"][1])
    return result


def measure(name: str, server: ServerProcess, protocol: str, args, script: Path) -> dict:
    scraper = Scraper(server.metrics_url) if "metrics" in name else None
    load_before = os.getloadavg()[0]
    if protocol == "HTTP":
        result = run_http(server, script, args.seconds, args.connections)
    else:
        result = run_grpc(server, args.seconds, args.connections)
    if scraper:
        scraper.stop()
        result["num_scrapes"] = scraper.num_scrapes
    result["load"] = (load_before + os.getloadavg()[0]) / 2
    assert result["errors"] == 0, result
    return result


def report(results: dict, args, sink: OtlpSink, started: str) -> str:
    lines = [f"# Observability cost on `simple`, {started}", "",
             f"`benchmarks/observability.py --rounds {args.rounds} --seconds {args.seconds}` "
             f"(HTTP: wrk -t1 -c{args.connections}, JSON body; gRPC: {args.connections} client threads). "
             f"Load average during the runs: {results['load_range']}. OTLP collector received "
             f"{sink.num_posts} posts, {sink.num_bytes / 1e6:.1f} MB.", ""]
    for protocol in ("HTTP", "gRPC"):
        runs = results[protocol]
        plain = runs["plain"]
        lines += [f"## {protocol}", "",
                  "| configuration | req/s (median) | vs plain (median of per-round ratios) | server process CPU µs/req "
                  "| exporter process CPU µs/req |", "|---|---:|---:|---:|---:|"]
        for name, rows in runs.items():
            ratios = [r["rps"] / b["rps"] for r, b in zip(rows, plain)]
            own = statistics.median(r["cpu"][0] / r["num_finished"] * 1e6 for r in rows)
            children = statistics.median(r["cpu"][1] / r["num_finished"] * 1e6 for r in rows)
            vs = "—" if name == "plain" else f"{(statistics.median(ratios) - 1) * 100:+.1f}%"
            lines.append(f"| {name} | {statistics.median(r['rps'] for r in rows):.0f} | {vs} | {own:.1f} | "
                         f"{children:.1f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--out", type=Path, default=HERE / "results" / "observability-run.md")
    args = p.parse_args(argv)
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    work = Path(tempfile.mkdtemp(prefix="bench-observability-"))
    repo = work / "repo"
    build(repo, ["simple"])
    script = write_lua_scripts(work / "lua")["json"]
    sink = OtlpSink()
    tracing = ["--trace-config", "level=TIMESTAMPS", "--trace-config", f"opentelemetry,url={sink.url}"]
    configs = {
        "plain": ["--allow-metrics", "false"],
        "tracing rate=1": ["--allow-metrics", "false", *tracing, "--trace-config", "rate=1"],
        "tracing rate=100": ["--allow-metrics", "false", *tracing, "--trace-config", "rate=100"],
        "metrics on, scraped 1/s": [],
    }
    servers = {name: ServerProcess([repo], *flags).start() for name, flags in configs.items()}
    results = {protocol: {name: [] for name in configs} for protocol in ("HTTP", "gRPC")}
    loads = []
    try:
        for r in range(args.rounds):
            names = list(configs)[r % len(configs):] + list(configs)[:r % len(configs)]
            for protocol in ("HTTP", "gRPC"):
                for name in names:
                    result = measure(name, servers[name], protocol, args, script)
                    results[protocol][name].append(result)
                    loads.append(result["load"])
                    cpu = sum(result["cpu"]) / result["num_finished"] * 1e6
                    print(f"round {r + 1} {protocol:4s} {name:24s} {result['rps']:8.0f} req/s  {cpu:6.1f} us CPU/req  "
                          f"load {result['load']:.1f}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    results["load_range"] = f"{min(loads):.1f}–{max(loads):.1f} (median {statistics.median(loads):.1f}, 2 cores)"
    text = report(results, args, sink, started)
    print("\n" + text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
