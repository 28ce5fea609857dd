"""The long schemathesis run: every operation of the server's OpenAPI document (`/openapi.json`),
`--examples` generated requests each in positive and negative mode, against the example models;
counts answers by status and lists any 5xx (501, "not offered here", is a deliberate answer).
The CI-sized version is tests/security/test_openapi_fuzz.py.

    .venv/bin/python benchmarks/fuzz_openapi.py --examples 200   # -> benchmarks/results/fuzz_openapi.md
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import httpx
import schemathesis

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples")]

from build_repository import build  # noqa: E402
from helpers.openapi_fuzz import fuzz, load_schema  # noqa: E402
from helpers.serverproc import ServerProcess  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--repo", type=Path, default=Path("/tmp/bench/fuzz_repo"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    build(args.repo, ["simple", "simple_string"])
    started = time.monotonic()
    with ServerProcess([args.repo], "--model-control-mode", "explicit", "--load-model", "*",
                       env={"MODELPLEX_PLUGINS": "onnx"}) as server:
        statuses, server_errors, operations = fuzz(load_schema(server.http_url), args.examples)
        live = httpx.get(f"http://{server.http_url}/v2/health/live", timeout=10).status_code == 200
        exit_code = server.stop()
    took = time.monotonic() - started
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# schemathesis against /openapi.json ({date})", "",
             f"schemathesis {schemathesis.SCHEMATHESIS_VERSION}, "
             f"{operations} operations, up to {args.examples} examples each in positive and negative mode "
             f"({sum(statuses.values())} requests, {took:.0f} s). Server live afterwards: {live}; exit code {exit_code}.",
             "", f"**5xx other than 501: {len(server_errors)}.**", "", "| status | requests |", "|---|---|"]
    lines += [f"| {status} | {n} |" for status, n in sorted(statuses.items())]
    if server_errors:
        lines += ["", "## Server errors (first 30)", ""] + [f"- {e}" for e in server_errors[:30]]
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fuzz_openapi.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
