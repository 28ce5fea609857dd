"""Host A/B: `simple` on this tree's modelplex vs a baseline build of modelplex (another commit), paired.

For a change that must leave the request path's speed alone (a refactor): the same cells as
`host.py` at c=64 (HTTP JSON and binary with wrk, gRPC with tritonclient threads), each round running
every cell on both builds back to back with the order flipping, so a pair shares the machine's noise.
Reports req/s medians and the paired ratios (this tree / baseline) with their spread.

    git worktree add /tmp/base <commit>                        # the baseline's source
    .venv/bin/pip install --no-deps --no-build-isolation --target /tmp/base-site /tmp/base
    .venv/bin/python benchmarks/host_ab.py --baseline-site /tmp/base-site --runs 5

The baseline runs as `python -m modelplex serve` with `--baseline-site` first on PYTHONPATH (its
modules and compiled recorder shadow this tree's editable install; the rest of the venv is shared).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import host_servers
from host import run_all
from host_wrk import write_lua_scripts

HERE = Path(__file__).resolve().parent
CONCURRENCY = 64


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline-site", type=Path, required=True, help="a pip --target install of the baseline")
    p.add_argument("--baseline-name", default="baseline", help="its name in the report (e.g. its commit)")
    p.add_argument("--runs", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per run (default 8)")
    p.add_argument("--warmup", type=float, default=2.0, help="discarded seconds before each run (default 2)")
    p.add_argument("--port", type=int, default=18190, help="HTTP port of this tree; the baseline uses +10")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench/host_ab"))
    p.add_argument("--out", type=Path, default=HERE / "results" / "host_ab.md")
    return p.parse_args(argv)


def specs(args) -> list[host_servers.ServerSpec]:
    def ports(base):
        return {"http": base, "grpc": base + 1, "metrics": base + 2}

    current = host_servers.modelplex_spec(args.workdir / "current_repository", ports(args.port))
    baseline = host_servers.modelplex_spec(args.workdir / "baseline_repository", ports(args.port + 10))
    baseline.name, baseline.version = args.baseline_name, f"{args.baseline_name} ({args.baseline_site})"
    baseline.argv = [sys.executable, "-m", "modelplex", *baseline.argv[1:]]
    baseline.env = {"PYTHONPATH": str(args.baseline_site)}
    return [current, baseline]


def report(records: list[dict], names: tuple[str, str], args) -> str:
    cells = sorted({(r["protocol"], r["client"]) for r in records})
    lines = [f"# Host A/B at c={CONCURRENCY}: {names[0]} vs {names[1]}", "",
             f"`benchmarks/host_ab.py`, {args.runs} rounds x {args.seconds:.0f} s (warm-up {args.warmup:.0f} s), "
             "pairs run back to back, order flipping; req/s median (min-max) over rounds.", "",
             "Server CPU µs per request (its process's CPU time over a run / requests answered) moves far less "
             "with the machine's other load than req/s does.", "",
             f"| protocol | client | {names[0]} req/s | {names[1]} req/s | paired req/s ratio median (min-max) | "
             f"server CPU µs/req {names[0]} / {names[1]} (medians) |",
             "|---|---|---|---|---|---|"]
    for protocol, client in cells:
        by = {n: {r["round"]: r["rps"] for r in records if (r["server"], r["protocol"], r["client"]) ==
                  (n, protocol, client)} for n in names}
        rounds = sorted(set(by[names[0]]) & set(by[names[1]]))
        ratios = [by[names[0]][k] / by[names[1]][k] for k in rounds if by[names[1]][k]]

        def cell(values):
            return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})" if values else "-"

        ratio = (f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})" if ratios else "-")
        cpu = [statistics.median([r["cpu_us_per_req"] for r in records if r.get("cpu_us_per_req") and
                                  (r["server"], r["protocol"], r["client"]) == (n, protocol, client)] or [0])
               for n in names]
        lines.append(f"| {protocol} | {client} | {cell(list(by[names[0]].values()))} | "
                     f"{cell(list(by[names[1]].values()))} | {ratio} | {cpu[0]:.1f} / {cpu[1]:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    import host_report

    host_report.CELLS = [c for c in host_report.CELLS if c[2] == CONCURRENCY]  # the cells: c=64
    servers = specs(args)
    lua = write_lua_scripts(args.workdir / "lua")
    with open(args.workdir / "runs.jsonl", "w") as out:
        records = run_all(servers, args, lua, out)
    text = report(records, (servers[0].name, servers[1].name), args)
    text += "\nServers: " + "; ".join(f"{s.name}: {s.version}" for s in servers) + "\n"
    text += f"Finished {time.strftime('%Y-%m-%d %H:%M')}; raw runs in {args.workdir / 'runs.jsonl'}.\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
