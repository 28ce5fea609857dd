"""Servers under test: MLServer venv + model folder, modelplex's `simple` repository, start/stop.

A server is started only on free ports, and is trusted only once /proc shows that its own pid (or
a descendant) holds the listening sockets: a readiness probe happily answers from a leftover server.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
MLSERVER_VERSION = "1.7.1"
UVLOOP_FOR_MLSERVER = "0.21.0"


@dataclass
class ServerSpec:
    """How to start one server; `ports` is http, grpc, metrics."""

    name: str
    argv: list[str]
    cwd: Path
    ports: dict[str, int]
    has_binary_http: bool
    version: str = ""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def http_url(self) -> str:
        return "http://127.0.0.1:%d" % self.ports["http"]

    @property
    def grpc_target(self) -> str:
        return "127.0.0.1:%d" % self.ports["grpc"]


def _pip_version(venv: Path, package: str) -> str | None:
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "show", package],
                          capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return None


def ensure_mlserver_venv(venv: Path, log) -> str:
    """Reuse or create `venv` as the shared README did: `pip install mlserver`, then pin uvloop."""
    if not (venv / "bin" / "mlserver").exists():
        log("creating MLServer venv %s (takes a minute)" % venv)
        subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "pip"), "install", "-q"]
        subprocess.run(pip + ["mlserver==%s" % MLSERVER_VERSION], check=True)
        subprocess.run(pip + ["uvloop==%s" % UVLOOP_FOR_MLSERVER], check=True)
    versions = {p: _pip_version(venv, p) for p in ("mlserver", "uvloop")}
    if versions != {"mlserver": MLSERVER_VERSION, "uvloop": UVLOOP_FOR_MLSERVER}:
        raise RuntimeError("%s has %s; want mlserver %s + uvloop %s (or delete it to rebuild)"
                           % (venv, versions, MLSERVER_VERSION, UVLOOP_FOR_MLSERVER))
    return "mlserver %s, uvloop %s" % (versions["mlserver"], versions["uvloop"])


def mlserver_spec(venv: Path, folder: Path, ports: dict[str, int], version: str) -> ServerSpec:
    """MLServer's fastest setup on this host: parallel_workers 0, debug false (no access log)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("addsub.py", "model-settings.json"):
        shutil.copy(HERE / "mlserver_model" / name, folder / name)
    settings = {"parallel_workers": 0, "debug": False, "host": "127.0.0.1", "http_port": ports["http"],
                "grpc_port": ports["grpc"], "metrics_port": ports["metrics"]}
    (folder / "settings.json").write_text(json.dumps(settings))
    return ServerSpec("MLServer", [str(venv / "bin" / "mlserver"), "start", "."], folder, ports,
                      has_binary_http=False, version=version)


def modelplex_spec(repository: Path, ports: dict[str, int]) -> ServerSpec:
    """Builds Triton's `simple` with examples/build_repository.py and serves it with `modelplex serve`."""
    if repository.exists():
        shutil.rmtree(repository)
    # The builder imports its sibling modules (sequence_models) as a script run from examples/ would.
    subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "build_repository.py"), str(repository),
                    "--models", "simple", "--force"],
                   check=True, capture_output=True)
    exe = Path(sys.executable).with_name("modelplex")
    argv = [str(exe), "serve", "--model-repository", str(repository), "--host", "127.0.0.1",
            "--http-port", str(ports["http"]), "--grpc-port", str(ports["grpc"]),
            "--metrics-port", str(ports["metrics"])]
    return ServerSpec("modelplex", argv, repository.parent, ports, has_binary_http=True, version=_work_tree_version())


def _work_tree_version() -> str:
    """The commit served, and which server files differ from it (colleagues may be mid-change)."""
    def git(*cmd):
        return subprocess.run(["git", "-C", str(REPO_ROOT), *cmd], capture_output=True, text=True,
                              check=False).stdout.strip()

    changed = git("status", "--porcelain", "--", "platform/modelplex", "backends/onnx").splitlines()
    version = "modelplex @ %s" % git("rev-parse", "--short", "HEAD")
    if changed:
        version += " + uncommitted changes to %s" % ", ".join(line[3:] for line in changed)
    return version


# --- ports and pids, read from /proc -------------------------------------------------------------

def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def _pids_with_inodes(inodes: set[str], pids) -> set[int]:
    found = set()
    for pid in pids:
        try:
            for fd in os.listdir("/proc/%d/fd" % pid):
                link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    found.add(pid)
                    break
        except OSError:
            continue
    return found


def _all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def descendants(pid: int) -> set[int]:
    parents = {}
    for p in _all_pids():
        try:
            parents[p] = int(Path("/proc/%d/stat" % p).read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    family, grew = {pid}, True
    while grew:
        new = {p for p, pp in parents.items() if pp in family} - family
        family |= new
        grew = bool(new)
    return family


def port_holders(port: int) -> set[int]:
    inodes = _listening_inodes(port)
    return _pids_with_inodes(inodes, _all_pids()) if inodes else set()


def check_ports_free(ports: dict[str, int]) -> None:
    for name, port in ports.items():
        holders = port_holders(port)
        if holders or _listening_inodes(port):
            raise RuntimeError("%s port %d is already in use (pids %s)" % (name, port, sorted(holders) or "?"))
        with socket.socket() as s:  # also catches a port held in another network namespace's view
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by `pid` (all its threads) and its live descendants."""
    total = 0.0
    for p in descendants(pid):
        try:
            fields = Path("/proc/%d/stat" % p).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return total


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- lifecycle -----------------------------------------------------------------------------------

def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v2/models/simple/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def start(spec: ServerSpec, log_path: Path, timeout: float = 120.0) -> subprocess.Popen:
    """Starts the server, waits until `simple` is ready and checks the ports belong to its pid."""
    check_ports_free(spec.ports)
    log_file = open(log_path, "ab")
    env = dict(os.environ, **spec.env)
    proc = subprocess.Popen(spec.argv, cwd=spec.cwd, stdout=log_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env)
    log_file.close()
    deadline = time.monotonic() + timeout
    while not _ready(spec.http_url):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError("%s did not become ready (exit %s); log tail:\n%s" % (spec.name, proc.returncode, tail))
        time.sleep(0.25)
    family = descendants(proc.pid)
    for name in ("http", "grpc"):
        holders = port_holders(spec.ports[name])
        if not holders or not holders <= family:
            stop(proc)
            raise RuntimeError("%s port %d is held by pids %s, not by %s (pid %d)"
                               % (name, spec.ports[name], sorted(holders), spec.name, proc.pid))
    return proc


def stop(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM our server (and any worker it forked), SIGKILL whatever outlives the grace period."""
    family = descendants(proc.pid) - {proc.pid}
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pid in family:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
