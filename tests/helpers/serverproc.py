"""Starts the real `modelplex serve` in a subprocess on ephemeral ports, as a user would run it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class ServerProcess:
    """`with ServerProcess([repo], "--model-control-mode", "explicit") as s: s.http_url ...`"""

    def __init__(self, repositories: list[Path], *args: str, env: dict | None = None, timeout: float = 120,
                 command: list | None = None):
        """`command` runs modelplex (default: this interpreter's, `python -m modelplex`)."""
        self.repositories, self.args, self.timeout = repositories, list(args), timeout
        self.command = command or [sys.executable, "-m", "modelplex"]
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.ports: dict[str, int] = {}
        self._dir = Path(tempfile.mkdtemp(prefix="modelplex-test-"))
        self.log_path = self._dir / "server.log"

    def start(self) -> ServerProcess:
        port_file = self._dir / "ports.json"
        cmd = [*self.command, "serve", "--host", "127.0.0.1", "--http-port", "0",
               "--grpc-port", "0", "--metrics-port", "0", "--port-file", str(port_file)]
        for repo in self.repositories:
            cmd += ["--model-repository", str(repo)]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd + self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + self.timeout
        while not port_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server did not start in {self.timeout}s:\n{self.log()}")
            time.sleep(0.05)
        self.ports = json.loads(port_file.read_text())
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}/metrics"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self._log.close()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
