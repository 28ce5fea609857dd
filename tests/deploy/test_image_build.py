"""What `docker build` would do, without a Docker engine (none in CI, and no registry to pull the base image
from): the Dockerfile's own steps, read from it, run against this machine's Python 3.11 in a fresh venv
with nothing of the test environment on its path. The builder's RUN steps run as written, with the
image's directories moved under a temporary root; the runtime stage gets what COPY --from brings; then
the image's ENTRYPOINT + CMD serves a model repository mounted where CMD expects it, and the health
checks answer.

Not covered (they need an engine): apt-get steps (checked to install what is expected, not run), the
user and group, file ownership."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest
from helpers.dockerfile_steps import ROOT, Instruction, stages

# Base-image directories the steps may read or clean up (apt's lists, pip's own files); any other
# absolute path (/src, /wheels, /opt/venv, /models, ...) belongs to the image and moves under the root.
SYSTEM_DIRS = {"usr", "bin", "sbin", "lib", "lib64", "etc", "var", "dev", "proc", "sys", "tmp"}
ABSOLUTE_PATH = re.compile(r"(?<![\w.$}/:-])/([\w.-]+)")
BUILD_SECS = 600  # a cold pip cache downloads onnxruntime and friends; a warm one takes about a minute


class Emulator:
    """Runs Dockerfile instructions of one build with the image's directories under `root`."""

    def __init__(self, root: Path, build_args: dict[str, str]):
        self.root, self.build_args = root, build_args
        # The Python the image would have: this interpreter's base installation, not the test venv.
        base_bin = Path(sys.base_prefix) / "bin"
        self.env = {"PATH": f"{base_bin}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
                    # This machine's pip settings (local wheel mirrors); the image build uses PyPI itself.
                    **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}}
        self.cwd = root

    def relocate(self, text: str) -> str:
        return ABSOLUTE_PATH.sub(
            lambda m: m[0] if m[1] in SYSTEM_DIRS else f"{self.root}/{m[1]}", text)

    def expand(self, text: str) -> str:
        """${VAR} and $VAR as the Dockerfile expands them in ENV values."""
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: self.env.get(m[1] or m[2], ""), text)

    def arg(self, rest: str) -> None:
        name, _, default = rest.partition("=")
        self.env[name] = self.build_args.get(name, default)

    def set_env(self, rest: str) -> None:
        for item in shlex.split(rest):
            name, _, value = item.partition("=")
            self.env[name] = self.expand(self.relocate(value))

    def workdir(self, rest: str) -> None:
        self.cwd = Path(self.relocate(rest))
        self.cwd.mkdir(parents=True, exist_ok=True)

    def copy_sources(self, rest: str) -> None:
        *sources, dest = rest.split()
        target = self.cwd / self.relocate(dest)
        for source in sources:
            path = ROOT / source
            if path.is_dir():
                shutil.copytree(path, target / source if dest.endswith("/") else target,
                                ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"), dirs_exist_ok=True)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)

    def run(self, rest: str, timeout: float) -> None:
        command = self.relocate(rest)
        done = subprocess.run(["bash", "-ec", command], cwd=self.cwd, env=self.env, timeout=timeout,
                              capture_output=True, text=True)
        assert done.returncode == 0, f"RUN {rest}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def apt_packages(stage: list[Instruction]) -> set[str]:
    return {word for w, rest in stage if w == "RUN" and "apt-get install" in rest
            for word in rest.split("apt-get install", 1)[1].split("&&")[0].split() if not word.startswith("-")}


def build(root: Path, build_args: dict[str, str]) -> Emulator:
    """The builder stage, then the runtime stage's ENV and COPY --from; returns the runtime's state."""
    builder, runtime = stages()[0], stages()[-1]
    assert {"gcc", "libc6-dev"} <= apt_packages(builder)  # this machine has them; the image gets them so
    emulator = Emulator(root, build_args)
    for word, rest in builder[1:]:
        if word == "ARG":
            emulator.arg(rest)
        elif word == "ENV":
            emulator.set_env(rest)
        elif word == "WORKDIR":
            emulator.workdir(rest)
        elif word == "COPY":
            emulator.copy_sources(rest)
        elif word == "RUN" and "apt-get" not in rest:
            emulator.run(rest, BUILD_SECS)
    # The image keeps no pip cache; the emulation uses this machine's, so a run costs no downloads.
    emulator.env.pop("PIP_NO_CACHE_DIR")
    runtime_env = Emulator(root, build_args)
    for word, rest in runtime[1:]:
        if word == "ARG":
            runtime_env.arg(rest)
        elif word == "ENV":
            runtime_env.set_env(rest)
        elif word == "COPY":
            # A venv holds its own absolute path: it must land where the builder made it.
            source, dest = rest.split()[1:]
            assert rest.startswith("--from=builder") and source == dest, rest
            assert Path(runtime_env.relocate(source)).exists(), source
        elif word == "RUN":
            # System setup only (the user, native_gpu's compiler): no step the emulation would skip
            # may build or install the project.
            assert "pip" not in rest.split() and "python" not in rest.split(), rest
    return runtime_env


def exec_form(stage: list[Instruction], word: str) -> list[str]:
    return json.loads([rest for w, rest in stage if w == word][-1])


@pytest.mark.slow
def test_image_builds_and_serves(tmp_path, example_repo):
    root = tmp_path / "image"
    runtime = build(root, {"EXTRAS": "onnx"})

    # The wheel carries the compiled span recorder (the fast path; the pure-Python one is the fallback).
    [wheel] = root.glob("wheels/modelplex-*.whl")
    assert any(re.search(r"/_span_recorder\.[\w-]+\.so$", name) for name in zipfile.ZipFile(wheel).namelist())

    entrypoint, cmd = exec_form(stages()[-1], "ENTRYPOINT"), exec_form(stages()[-1], "CMD")
    program = shutil.which(entrypoint[0], path=runtime.env["PATH"])
    assert program and program.startswith(str(root)), (entrypoint, runtime.env["PATH"])
    version = subprocess.run([program, "--version"], env=runtime.env, capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("modelplex "), version.stderr[-2000:]

    # The repository goes where CMD looks for it (the pod's volume mount); ports are this machine's free ones.
    for arg in cmd:
        if arg.startswith("/"):
            Path(runtime.relocate(arg)).parent.mkdir(parents=True, exist_ok=True)
            Path(runtime.relocate(arg)).symlink_to(example_repo)
    ports = tmp_path / "ports.json"
    args = [runtime.relocate(a) for a in cmd] + ["--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
                                                 "--metrics-port", "0", "--port-file", str(ports)]
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen([program, *entrypoint[1:], *args], env=runtime.env, cwd=tmp_path,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not ports.exists():
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.1)
        http = json.loads(ports.read_text())["http"]
        assert httpx.get(f"http://127.0.0.1:{http}/v2/health/ready").status_code == 200
        assert httpx.get(f"http://127.0.0.1:{http}/v2/models/simple/ready").status_code == 200
        # The image's own HEALTHCHECK command, on this server's port.
        check = next(rest for w, rest in stages()[-1] if w == "HEALTHCHECK").split("CMD", 1)[1]
        check_cmd = [a.replace("127.0.0.1:8000", f"127.0.0.1:{http}") for a in json.loads(check)]
        assert check_cmd != json.loads(check), check  # it probes the image's HTTP port, 8000
        python = shutil.which(check_cmd[0], path=runtime.env["PATH"])
        assert python and python.startswith(str(root)), check_cmd
        subprocess.run([python, *check_cmd[1:]], env=runtime.env, check=True, timeout=30)
    finally:
        server.terminate()
        returncode = server.wait(60)
        log.close()
    assert returncode == 0, (tmp_path / "server.log").read_text()  # SIGTERM drains and exits 0
