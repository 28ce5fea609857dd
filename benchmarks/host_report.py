"""Turns the per-run JSON records of `host.py` into the markdown tables (medians over runs)."""
from __future__ import annotations

import statistics
from collections import defaultdict

# (protocol, client, concurrency) in table order; the client column says who generated the load.
CELLS = [
    ("HTTP JSON", "httpx", 1), ("HTTP JSON", "wrk", 16), ("HTTP JSON", "wrk", 64),
    ("HTTP binary", "httpx", 1), ("HTTP binary", "wrk", 16), ("HTTP binary", "wrk", 64),
    ("gRPC", "tritonclient threads", 1), ("gRPC", "tritonclient threads", 16),
    ("gRPC", "tritonclient threads", 64),
]
SERVERS = ["modelplex", "MLServer"]


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(x, digits=2):
    return "–" if x is None else "%.*f" % (digits, x)


def group(records):
    """{(server, protocol, client, conc): [records]}"""
    groups = defaultdict(list)
    for r in records:
        groups[(r["server"], r["protocol"], r["client"], r["conc"])].append(r)
    return groups


def summary(rs):
    rps = [r["rps"] for r in rs]
    return {"rps": _median(rps), "min": min(rps), "max": max(rps), "p50": _median([r["p50_ms"] for r in rs]),
            "p99": _median([r["p99_ms"] for r in rs]), "errors": sum(r["errors"] for r in rs), "runs": len(rs),
            "cpu": _median([r.get("cpu_us_per_req") for r in rs]),
            "first_error": next((r["first_error"] for r in rs if r.get("first_error")), None)}


def results_table(records, not_applicable) -> list[str]:
    groups = group(records)
    lines = ["| server | protocol | client | conc | req/s median (min–max) | p50 ms | p99 ms | server CPU µs/req "
             "| errors | runs |",
             "|---|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for server in SERVERS:
        for protocol, client, conc in CELLS:
            rs = groups.get((server, protocol, client, conc))
            if not any(k[0] == server for k in groups):
                break
            if (server, protocol) in not_applicable:
                lines.append("| %s | %s | %s | %d | n/a (%s) | | | | | |"
                             % (server, protocol, client, conc, not_applicable[(server, protocol)]))
            elif rs:
                s = summary(rs)
                lines.append("| %s | %s | %s | %d | **%.0f** (%.0f–%.0f) | %s | %s | %s | %d | %d |"
                             % (server, protocol, client, conc, s["rps"], s["min"], s["max"],
                                _fmt(s["p50"]), _fmt(s["p99"]), _fmt(s["cpu"], 0), s["errors"], s["runs"]))
    return lines


def _paired_ratios(mine, base):
    """modelplex/MLServer req/s of the same round's runs (the two ran back to back, seconds apart)."""
    by_round = {r["round"]: r["rps"] for r in base}
    return sorted(r["rps"] / by_round[r["round"]] for r in mine if by_round.get(r["round"]))


def ratio_table(records, conc=64) -> list[str]:
    groups = group(records)
    lines = ["| modelplex | vs MLServer | conc | req/s ratio of medians | paired ratios: median (min–max) | "
             "p99 ms modelplex / MLServer | server CPU µs/req modelplex / MLServer | ≥2× req/s and lower p99? |",
             "|---|---|---:|---:|---|---|---|---|"]
    pairs = [("HTTP JSON", "wrk", "HTTP JSON", "wrk"), ("gRPC", "tritonclient threads", "gRPC", "tritonclient threads"),
             ("HTTP binary", "wrk", "HTTP JSON", "wrk")]
    for proto, client, base_proto, base_client in pairs:
        mine = groups.get(("modelplex", proto, client, conc))
        base = groups.get(("MLServer", base_proto, base_client, conc))
        if not mine or not base:
            continue
        m, b = summary(mine), summary(base)
        ratio = m["rps"] / b["rps"] if b["rps"] else None
        paired = _paired_ratios(mine, base)
        span = "%.2f (%.2f–%.2f)" % (_median(paired), paired[0], paired[-1]) if paired else "–"
        met = ratio is not None and ratio >= 2.0 and m["p99"] is not None and b["p99"] is not None \
            and m["p99"] < b["p99"] and m["errors"] == 0
        cpu = "%s / %s" % (_fmt(m["cpu"], 0), _fmt(b["cpu"], 0))
        if m["cpu"] and b["cpu"]:
            cpu += " (%.2f× less)" % (b["cpu"] / m["cpu"])
        lines.append("| %s (%s) | %s (%s) | %d | **%s×** | %s | %s / %s | %s | %s |"
                     % (proto, client, base_proto, base_client, conc, _fmt(ratio), span,
                        _fmt(m["p99"]), _fmt(b["p99"]), cpu, "yes" if met else "**no**"))
    return lines


def error_notes(records) -> list[str]:
    notes = []
    for key, rs in group(records).items():
        s = summary(rs)
        if s["errors"]:
            notes.append("- %s / %s / %s / c=%d: %d errors, first: `%s`" % (*key, s["errors"], s["first_error"]))
    return notes
