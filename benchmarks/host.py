"""Host benchmark: `simple` (INT32 add/sub) on modelplex vs MLServer, same machine, same load generators.

Requests/s and p50/p99 latency over HTTP JSON, HTTP binary (Triton binary tensor extension;
MLServer has none) and gRPC at concurrency 1, 16 and 64. HTTP at c=1 uses the Python client
(`host_load.py`, httpx), at c=16/64 `wrk` (a Python HTTP client is the bottleneck there); gRPC uses
`tritonclient.grpc` from N threads. One server runs at a time. In each round every cell runs once
on each server back to back (order flipping A B, B A, ...), so the two servers of a pair see the
same machine noise; rows report the median (min–max) over rounds, and the ratio table compares
modelplex with MLServer at c=64.

    .venv/bin/python benchmarks/host.py                    # 3 rounds x 10 s -> benchmarks/results/host.md
    .venv/bin/python benchmarks/host.py --quick            # 1 round x 3 s, report under /tmp/bench/host
    .venv/bin/python benchmarks/host.py --report-only /tmp/bench/host/runs.jsonl

Needs: `wrk` (apt-get install -y wrk), python3.11 (for the MLServer venv, built on first use).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import host_report
import host_servers
from host_load import INFER_PATH, binary_body, check_http_answer, json_body
from host_wrk import run_wrk, write_lua_scripts

HERE = Path(__file__).resolve().parent


def log(msg: str) -> None:
    print("[host %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def probe(spec: host_servers.ServerSpec) -> dict[str, str | None]:
    """One request per protocol before measuring; wrk checks only status codes, so answers are checked here."""
    import httpx
    import numpy as np
    import tritonclient.grpc as grpcclient

    problems = {}
    payload, header_len = binary_body()
    bodies = {"HTTP JSON": (json_body(), {"content-type": "application/json"}),
              "HTTP binary": (payload, {"content-type": "application/octet-stream",
                                        "inference-header-content-length": str(header_len)})}
    for protocol, (body, headers) in bodies.items():
        if protocol == "HTTP binary" and not spec.has_binary_http:
            continue
        try:
            r = httpx.post(spec.http_url + INFER_PATH, content=body, headers=headers, timeout=10)
            problems[protocol] = check_http_answer(r.status_code, r.headers, r.content)
        except Exception as e:
            problems[protocol] = repr(e)
    try:
        client = grpcclient.InferenceServerClient(spec.grpc_target)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        inputs[1].set_data_from_numpy(np.ones((1, 16), np.int32))
        res = client.infer("simple", inputs)
        ok = (res.as_numpy("OUTPUT0") == np.arange(1, 17)).all() and (res.as_numpy("OUTPUT1") == np.arange(-1, 15)).all()
        problems["gRPC"] = None if ok else "bad outputs"
        client.close()
    except Exception as e:
        problems["gRPC"] = repr(e)[:300]
    return problems


def run_cell(spec, pid, protocol, client, conc, args, lua) -> dict:
    """One run; adds `cpu_us_per_req`: the server's CPU time per answered request, which the
    machine's other load changes far less than req/s (it slows a server more than it adds work)."""
    def server_cpu():
        return host_servers.cpu_seconds(pid)

    if client == "wrk":
        body = "binary" if protocol == "HTTP binary" else "json"
        result = run_wrk(spec.http_url, lua[body], conc, args.seconds, args.warmup, server_cpu)
    else:
        cpu_before = server_cpu()
        result = _run_python_client(spec, protocol, conc, args)
        result["server_cpu_s"] = server_cpu() - cpu_before
    finished = result.get("num_finished")
    result["cpu_us_per_req"] = result["server_cpu_s"] / finished * 1e6 if finished else None
    return result


def _run_python_client(spec, protocol, conc, args) -> dict:
    if protocol == "gRPC":
        cmd = ["grpc", "--url", spec.grpc_target]
    else:
        cmd = ["http", "--url", spec.http_url, "--body", "binary" if protocol == "HTTP binary" else "json"]
    cmd += ["--concurrency", str(conc), "--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    done = subprocess.run([sys.executable, str(HERE / "host_load.py")] + cmd, capture_output=True, text=True,
                          timeout=args.seconds + args.warmup + 120, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError("load generator failed: %s" % done.stderr[-2000:])
    return json.loads(lines[-1])


def schedule(specs, runs):
    """(round, spec, cell) in run order. Within a round every cell runs on each server back to back, and
    the server order flips from cell to cell (A B, B A, A B, ...) so a server keeps running across the
    cell boundary: each modelplex/MLServer pair is measured within seconds of each other, yet only one
    server is up at a time."""
    order = []
    for round_no in range(runs):
        for i, cell in enumerate(host_report.CELLS):
            pair = specs if (round_no + i) % 2 == 0 else specs[::-1]
            order += [(round_no, spec, cell) for spec in pair if spec.has_binary_http or cell[0] != "HTTP binary"]
    return order


class Running:
    """The one server currently up; switching stops it before the next one starts."""

    def __init__(self, args):
        self.args, self.spec, self.proc, self.problems = args, None, None, {}

    def use(self, spec):
        if self.spec is spec:
            return
        self.close()
        t0 = time.monotonic()
        self.proc = host_servers.start(spec, self.args.workdir / ("%s.log" % spec.name))
        self.spec, self.problems = spec, probe(spec)
        log("%s ready in %.1f s (pid %d); probe: %s" % (spec.name, time.monotonic() - t0, self.proc.pid,
                                                        self.problems))

    def close(self):
        if self.proc is not None:
            host_servers.stop(self.proc)
        self.spec = self.proc = None


def run_all(specs, args, lua, out) -> list[dict]:
    records, running = [], Running(args)
    try:
        for round_no, spec, (protocol, client, conc) in schedule(specs, args.runs):
            running.use(spec)
            if running.problems.get(protocol):
                log("%s %s: probe failed, skipped: %s" % (spec.name, protocol, running.problems[protocol]))
                continue
            load1 = os.getloadavg()[0]
            try:
                result = run_cell(spec, running.proc.pid, protocol, client, conc, args, lua)
            except Exception as e:
                result = {"rps": 0.0, "p50_ms": None, "p99_ms": None, "errors": 1, "first_error": repr(e)[:300]}
            record = {"round": round_no, "server": spec.name, "protocol": protocol, "client": client,
                      "conc": conc, "load1_before": load1, "seconds": args.seconds, **result}
            records.append(record)
            out.write(json.dumps(record) + "\n")
            out.flush()
            log("round %d: %-9s %-11s %-20s c=%-2d %7.0f req/s  p50 %s  p99 %s  cpu/req %s us  errors %d  "
                "(load %.1f)" % (round_no, spec.name, protocol, client, conc, record["rps"], _fmt(record["p50_ms"]),
                                 _fmt(record["p99_ms"]), _fmt(record.get("cpu_us_per_req")), record["errors"], load1))
    finally:
        running.close()
    return records


def _fmt(x):
    return "–" if x is None else "%.2f" % x


def render(records, args, versions, started, finished) -> str:
    not_applicable = {("MLServer", "HTTP binary"): "MLServer has no binary tensor extension"}
    loads = [r["load1_before"] for r in records if "load1_before" in r]
    runs = max((r["round"] for r in records), default=0) + 1
    lines = [
        "# Host benchmark: `simple` on modelplex vs MLServer", "",
        "Generated by `benchmarks/host.py` (%s). Started %s, finished %s (UTC)." % (args.cmdline, started, finished),
        "Host: %d cores, Python %s, %s. Client and server share the machine over 127.0.0.1."
        % (os.cpu_count(), platform.python_version(), platform.platform()), "",
        "- Servers: %s." % "; ".join("%s: %s" % kv for kv in versions.items()),
        "- MLServer: custom `MLModel` (`benchmarks/mlserver_model/addsub.py`), parallel_workers 0, debug false.",
        "- modelplex: `modelplex serve` on the repository made by `examples/build_repository.py` (ONNX Runtime).",
        "- %d round(s). Only one server is up at a time; in a round each cell runs once on each server back "
        "to back (server order flipping from cell to cell, so a pair is measured seconds apart and shares "
        "the machine's noise). Each run: %.0f s warm-up discarded, %.0f s measured. Rows: req/s median "
        "(min–max) over rounds, p50/p99 = median over rounds." % (runs, args.warmup, args.seconds),
        "- Clients: `httpx` = `benchmarks/host_load.py` (Python, 1 connection); `wrk` = Debian wrk 4.1.0, "
        "-t2, one Lua script per body (binary body with `Inference-Header-Content-Length`); "
        "`tritonclient threads` = `tritonclient.grpc` blocking `infer()` in N threads. Python clients check "
        "OUTPUT0/OUTPUT1 on every answer; wrk counts non-2xx and socket errors, and each server's answers "
        "are checked once per round before wrk runs.",
        "- 1-min load average before each run: %s (the machine is shared; this includes other people's "
        "work, so absolute numbers move a lot between runs: compare the paired ratios)."
        % ("%.2f–%.2f" % (min(loads), max(loads)) if loads else "–"),
        "- Server CPU µs/req: the server process's user+system CPU time (all threads, from /proc) over "
        "a run, divided by the requests it answered in it. Other load slows a server down much more than "
        "it makes it work more per request (it still inflates it, for both servers), so this is the "
        "steadiest number here.",
        "", "## Results", ""]
    lines += host_report.results_table(records, not_applicable)
    lines += ["", "## modelplex / MLServer at concurrency 64", "",
              "Goal: ≥ 2× MLServer's req/s with a lower p99 (medians over rounds). Paired ratios divide the two "
              "servers' runs of the same round, measured back to back. The binary row compares against "
              "MLServer's JSON (its only HTTP body format).", ""]
    lines += host_report.ratio_table(records)
    errors = host_report.error_notes(records)
    if errors:
        lines += ["", "## Errors", ""] + errors
    return "\n".join(lines) + "\n"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run (default 10)")
    p.add_argument("--runs", type=int, default=3, help="rounds; every cell runs once per round (default 3)")
    p.add_argument("--warmup", type=float, default=2.0, help="discarded seconds before each run (default 2)")
    p.add_argument("--quick", action="store_true", help="1 round x 3 s (1 s warm-up): a smoke run")
    p.add_argument("--servers", default="modelplex,mlserver", help="comma list of modelplex, mlserver")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench/host"), help="logs, repository, raw runs")
    p.add_argument("--mlserver-venv", type=Path, default=Path("/tmp/bench/ms"))
    p.add_argument("--mlserver-port", type=int, default=18080, help="HTTP port; gRPC +1, metrics +2")
    p.add_argument("--modelplex-port", type=int, default=18090, help="HTTP port; gRPC +1, metrics +2")
    p.add_argument("--out", type=Path, help="markdown report (default benchmarks/results/host.md; "
                                            "--quick: WORKDIR/host-quick.md)")
    p.add_argument("--report-only", type=Path, metavar="JSONL", help="only re-render a report from raw runs")
    args = p.parse_args(argv)
    args.cmdline = " ".join(["host.py"] + (argv if argv is not None else sys.argv[1:]))
    if args.quick:
        args.runs, args.seconds, args.warmup = 1, 3.0, 1.0
    if args.out is None:
        args.out = args.workdir / "host-quick.md" if args.quick else HERE / "results" / "host.md"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    if args.report_only:
        records = [json.loads(ln) for ln in args.report_only.read_text().splitlines() if ln.startswith("{")]
        meta = json.loads((args.report_only.with_suffix(".meta.json")).read_text())
        args.warmup, args.seconds, args.cmdline = meta["warmup"], meta["seconds"], meta["cmdline"]
        report = render(records, args, meta["versions"], meta["started"], meta.get("finished", "?"))
    else:
        if shutil.which("wrk") is None:
            sys.exit("wrk not found: apt-get install -y wrk")
        wanted = [s.strip().lower() for s in args.servers.split(",")]
        specs, versions = [], {}
        if "modelplex" in wanted:
            ports = {"http": args.modelplex_port, "grpc": args.modelplex_port + 1, "metrics": args.modelplex_port + 2}
            specs.append(host_servers.modelplex_spec(args.workdir / "modelplex_repository", ports))
        if "mlserver" in wanted:
            version = host_servers.ensure_mlserver_venv(args.mlserver_venv, log)
            ports = {"http": args.mlserver_port, "grpc": args.mlserver_port + 1, "metrics": args.mlserver_port + 2}
            specs.append(host_servers.mlserver_spec(args.mlserver_venv, args.workdir / "mlserver_model", ports, version))
        versions = {s.name: s.version for s in specs}
        lua = write_lua_scripts(args.workdir / "lua")
        raw = args.workdir / "runs.jsonl"
        meta = {"warmup": args.warmup, "seconds": args.seconds, "cmdline": args.cmdline, "versions": versions,
                "started": started}
        with open(raw, "w") as out:
            records = run_all(specs, args, lua, out)
        meta["finished"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
        raw.with_suffix(".meta.json").write_text(json.dumps(meta))
        report = render(records, args, versions, started, meta["finished"])
        if not args.quick:
            shutil.copy(raw, args.out.with_suffix(".jsonl"))
            shutil.copy(raw.with_suffix(".meta.json"), args.out.with_suffix(".meta.json"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)
    log("report written to %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
