"""`modelplex models|adapters|trace|logging|health`: a client of a running server's HTTP API, for people
and scripts.

Exit codes: 0 ok, 1 the server answered with an error (or is not ready), 2 usage, 3 server unreachable.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx  # imported when an admin command runs: `serve` and `--version` start without it (~80 ms)

OK, SERVER_ERROR, USAGE, UNREACHABLE = 0, 1, 2, 3
DEFAULT_URL = "http://localhost:8000"
DEFAULT_TIMEOUT_S, LOAD_TIMEOUT_S = 30.0, 3600.0  # a model load (an LLM's weights) may take minutes
PROGRESS_POLL_S = 0.5


class CommandError(Exception):
    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def add_admin_commands(sub) -> None:
    """Adds `models`, `adapters` and `health` to the `modelplex` subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("MODELPLEX_URL", DEFAULT_URL),
                        help=f"the server's HTTP address (default $MODELPLEX_URL or {DEFAULT_URL})")
    common.add_argument("--json", action="store_true", help="print the server's JSON answer")
    common.add_argument("--timeout", type=float, default=None,
                        help=f"seconds to wait for an answer (default {DEFAULT_TIMEOUT_S:g}; "
                             f"{LOAD_TIMEOUT_S:g} for a load)")
    common.add_argument("--token", default=os.environ.get("MODELPLEX_TOKEN"),
                        help="bearer token sent as Authorization (default $MODELPLEX_TOKEN)")
    common.add_argument("--token-file", type=Path, default=os.environ.get("MODELPLEX_TOKEN_FILE"),
                        help="a file holding the token, e.g. the server's --admin-token-file "
                             "(default $MODELPLEX_TOKEN_FILE; --token wins)")

    models = sub.add_parser("models", help="list, load, unload and inspect the models of a running server")
    m = models.add_subparsers(dest="action", required=True)
    m.add_parser("list", parents=[common], help="every model in the repository with its state")
    load = m.add_parser("load", parents=[common], help="load (or reload) a model")
    load.add_argument("name")
    load.add_argument("--config", type=Path, help="a JSON model config to load the model with")
    unload = m.add_parser("unload", parents=[common], help="unload a model")
    unload.add_argument("name")
    unload.add_argument("--unload-dependents", action="store_true", help="also unload ensembles using it")
    config = m.add_parser("config", parents=[common], help="a loaded model's configuration (JSON)")
    config.add_argument("name")
    config.add_argument("--version", default="")
    stats = m.add_parser("stats", parents=[common], help="request counts and mean latencies")
    stats.add_argument("name", nargs="?", default="")

    adapters = sub.add_parser("adapters", help="list, load and unload a model's LoRA adapters")
    a = adapters.add_subparsers(dest="action", required=True)
    a.add_parser("list", parents=[common]).add_argument("model")
    for action in ("load", "unload"):
        p = a.add_parser(action, parents=[common])
        p.add_argument("model")
        p.add_argument("adapter")
        if action == "load":
            p.add_argument("--source", help="where the adapter's files are (a folder the server can read)")

    sub.add_parser("health", parents=[common], help="is the server live and ready (exit 0 only when ready)")
    trace = sub.add_parser("trace", parents=[common], help="show or change the trace settings (Triton's)")
    trace.add_argument("--model", default="", help="a model's own settings (KEY=null clears its override)")
    trace.add_argument("changes", nargs="*", metavar="KEY=VALUE", help="e.g. trace_level=TIMESTAMPS trace_rate=100")
    logs = sub.add_parser("logging", parents=[common], help="show or change the log settings (Triton's)")
    logs.add_argument("changes", nargs="*", metavar="KEY=VALUE", help="e.g. log_verbose_level=1 log_info=false")


def _token(args: argparse.Namespace) -> str | None:
    if args.token or args.token_file is None:
        return args.token
    try:
        lines = Path(args.token_file).read_text().splitlines()
    except OSError as e:
        raise CommandError(f"--token-file: {e}", USAGE) from None
    return next((line.strip() for line in lines if line.strip()), None)


def run_admin_command(args: argparse.Namespace) -> int:
    import httpx

    try:
        token = _token(args)
    except CommandError as e:
        print(f"modelplex {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    timeout = args.timeout
    if timeout is None:
        is_load = args.command in ("models", "adapters") and args.action == "load"
        timeout = LOAD_TIMEOUT_S if is_load else DEFAULT_TIMEOUT_S
    client = httpx.Client(base_url=args.url.rstrip("/"), timeout=timeout,
                          headers={"Authorization": f"Bearer {token}"} if token else None)
    try:
        with client:
            command = {"models": _models, "adapters": _adapters, "health": _health, "trace": _trace,
                       "logging": _logging}[args.command]
            return command(client, args)
    except CommandError as e:
        print(f"modelplex {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except httpx.TransportError as e:
        print(f"modelplex {args.command}: cannot reach the server at {args.url} ({type(e).__name__}: {e}); "
              "is it running? (--url)", file=sys.stderr)
        return UNREACHABLE


def _call(client: httpx.Client, method: str, path: str, body: dict | None = None, missing: str = "") -> object:
    """The JSON answer of a call; an error answer raises CommandError with the server's message.
    `missing` is what to say when the route itself does not exist on this server."""
    response = client.request(method, path, json=body)
    try:
        data = response.json() if response.content else {}
    except ValueError:
        data = {"error": response.text.strip()[:200]}
    if response.is_success:
        return data
    message = data.get("error", "") if isinstance(data, dict) else ""
    # A route the server lacks is a 404, or a 400 when the repository's `{name:path}/load` route
    # took the rest of the path for a model name.
    if missing and ((response.status_code == 404 and message.startswith("Not Found"))
                    or (response.status_code == 400 and "/adapters/" in message and "invalid model name" in message)):
        raise CommandError(missing, SERVER_ERROR)
    raise CommandError(f"the server answered {response.status_code}: {message or response.reason_phrase}",
                       SERVER_ERROR)


def _models(client: httpx.Client, args) -> int:
    if args.action == "list":
        rows = _call(client, "POST", "/v2/repository/index", {})
        _print(args, rows, ["name", "version", "state", "reason"])
    elif args.action == "load":
        body = {}
        if args.config is not None:
            try:
                config = json.loads(args.config.read_text())
            except (OSError, ValueError) as e:
                raise CommandError(f"--config {args.config}: {e}", USAGE) from None
            body = {"parameters": {"config": json.dumps(config)}}
        _load_showing_progress(client, args.name, body)
        _done(args, f"loaded {args.name}")
    elif args.action == "unload":
        body = {"parameters": {"unload_dependents": True}} if args.unload_dependents else {}
        _call(client, "POST", f"/v2/repository/models/{args.name}/unload", body)
        _done(args, f"unloaded {args.name}")
    elif args.action == "config":
        version = f"/versions/{args.version}" if args.version else ""
        print(json.dumps(_call(client, "GET", f"/v2/models/{args.name}{version}/config"), indent=2))
    else:
        path = f"/v2/models/{args.name}/stats" if args.name else "/v2/models/stats"
        stats = _call(client, "GET", path)["model_stats"]
        _print(args, stats, ["name", "version", "success", "fail", "inferences", "executions",
                             "mean_ms", "queue_ms"], [_stats_row(s) for s in stats])
    return OK


def _load_showing_progress(client: httpx.Client, name: str, body: dict) -> None:
    """The load call; while it runs, each new step of the LOADING version (its reason in the
    repository index: instances created, weights loaded, KV cache allocated) is printed on stderr."""
    import httpx

    outcome: dict[str, object] = {}

    def load() -> None:
        try:
            outcome["answer"] = _call(client, "POST", f"/v2/repository/models/{name}/load", body)
        except BaseException as e:
            outcome["error"] = e

    worker = threading.Thread(target=load, name="load", daemon=True)
    worker.start()
    shown = set()
    with httpx.Client(base_url=client.base_url, headers=client.headers, timeout=5.0) as poller:
        while worker.join(PROGRESS_POLL_S) or worker.is_alive():
            try:
                rows = poller.post("/v2/repository/index", json={}).json()
            except (httpx.HTTPError, ValueError):
                continue  # progress is best effort; the load call decides the outcome
            for row in rows if isinstance(rows, list) else ():
                step = f"version {row.get('version')}: {row.get('reason')}"
                loading = row.get("name") == name and row.get("state") == "LOADING" and row.get("reason")
                if loading and step not in shown:
                    shown.add(step)
                    print(f"loading {name} {step}", file=sys.stderr, flush=True)
    if "error" in outcome:
        raise outcome["error"]


def _stats_row(s: dict) -> dict:
    phases = s["inference_stats"]
    ok = phases["success"]["count"]

    def mean_ms(phase: str) -> str:
        return f"{phases[phase]['ns'] / ok / 1e6:.3f}" if ok else "-"

    return {"name": s["name"], "version": s["version"], "success": ok, "fail": phases["fail"]["count"],
            "inferences": s["inference_count"], "executions": s["execution_count"],
            "mean_ms": mean_ms("success"), "queue_ms": mean_ms("queue")}


def _adapters(client: httpx.Client, args) -> int:
    base = f"/v2/repository/models/{args.model}/adapters"
    missing = f"this server has no adapter API (no route {base}); it needs the multi-LoRA admin routes"
    if args.action == "list":
        data = _call(client, "GET", base, missing=missing)
        rows = data.get("adapters", data) if isinstance(data, dict) else data
        _print(args, rows, ["name", "state", "source"])
    else:
        body = {"parameters": {"source": args.source}} if args.action == "load" and args.source else {}
        _call(client, "POST", f"{base}/{args.adapter}/{args.action}", body, missing=missing)
        _done(args, f"{args.action}ed adapter {args.adapter} of {args.model}")
    return OK


def _health(client: httpx.Client, args) -> int:
    live = client.get("/v2/health/live").status_code == 200
    ready = client.get("/v2/health/ready").status_code == 200
    if args.json:
        print(json.dumps({"live": live, "ready": ready}))
    else:
        print(f"live: {'yes' if live else 'no'}\nready: {'yes' if ready else 'no'}")
    return OK if live and ready else SERVER_ERROR


def _changes(items: list[str], value_of) -> dict:
    changes = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"expected KEY=VALUE, got {item!r}", USAGE)
        changes[key] = value_of(key, value)
    return changes


def _trace_value(key: str, value: str):
    """Triton's trace settings are strings; trace_level a list of them; null clears an override."""
    if value == "null":
        return None
    return value.split(",") if key == "trace_level" else value


def _log_value(key: str, value: str):
    """Triton's log settings are booleans (log_info...), an integer (log_verbose_level) or strings."""
    if value in ("true", "false"):
        return value == "true"
    return int(value) if value.isascii() and value.isdigit() else value


def _trace(client: httpx.Client, args) -> int:
    path = f"/v2/models/{args.model}/trace/setting" if args.model else "/v2/trace/setting"
    changes = _changes(args.changes, _trace_value)
    settings = _call(client, "POST", path, changes) if changes else _call(client, "GET", path)
    _print(args, settings, ["setting", "value"], [{"setting": k, "value": v} for k, v in settings.items()])
    return OK


def _logging(client: httpx.Client, args) -> int:
    changes = _changes(args.changes, _log_value)
    settings = _call(client, "POST", "/v2/logging", changes) if changes else _call(client, "GET", "/v2/logging")
    _print(args, settings, ["setting", "value"], [{"setting": k, "value": v} for k, v in settings.items()])
    return OK


def _done(args, message: str) -> None:
    print(json.dumps({"ok": True}) if args.json else message)


def _print(args, data, columns: list[str], rows: list[dict] | None = None) -> None:
    """`--json`: the server's answer as is; else a table of `rows` (default: `data`)."""
    if args.json:
        print(json.dumps(data, indent=2))
        return
    rows = data if rows is None else rows
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip())
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
