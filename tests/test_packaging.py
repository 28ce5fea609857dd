"""The wheel as a user gets it: built where no C compiler is, installed with the `onnx` extra alone into a
clean venv (no dev packages), `modelplex` runs, serves an ONNX model and records spans in Python.

Dependencies resolve as `make install` resolves them (pip's configuration: the machine's local indexes,
then PyPI through pip's cache): the pins include releases the local indexes lack, so a `--no-index`
install is not possible here; the install is most of this module's time (~40 s cold, less when cached).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import venv
import zipfile
from pathlib import Path

import httpx
import pytest
from helpers.otlp_receiver import receiver
from helpers.serverproc import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["modelplex", "modelplex_onnx", "modelplex_pytorch", "modelplex_native_gpu", "modelplex_openvino",
            "modelplex_python", "triton_python_backend_utils", "modelplex_multilora",
            "modelplex_ensembles", "modelplex_admin"]
DEV_PATH_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built as `python -m build` builds a release (an sdist, then the wheel from its unpacked copy: nothing
    from this tree's build/ folder), with a compiler that always fails: the span recorder stays Python."""
    out = tmp_path_factory.mktemp("dist")
    egg_info = ROOT / "modelplex.egg-info"
    existed = egg_info.exists()
    try:
        run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT, env=clean_env(CC="/bin/false"))
    finally:
        # The sdist step writes it into the tree; left behind, it would shadow the editable install's
        # entry points for anything run from the repository root.
        if not existed:
            shutil.rmtree(egg_info, ignore_errors=True)
    return next(out.glob("modelplex-*.whl"))


@pytest.fixture(scope="module")
def venv_bin(wheel, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv")
    venv.create(env_dir, with_pip=True)  # no system site-packages: only what the wheel pulls in
    run(env_dir / "bin" / "python", "-m", "pip", "install", "--quiet", f"{wheel}[onnx]")
    return env_dir / "bin"


def run(*command, env: dict | None = None, cwd: Path | None = None) -> str:
    """`command`'s output; its error output in the failure when it fails."""
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env or clean_env(), cwd=cwd)
    assert done.returncode == 0, f"{command}:\n{done.stderr[-4000:]}"
    return done.stdout


def clean_env(**extra: str) -> dict:
    """This environment without what would put the dev venv's packages on a child's path."""
    return {**{k: v for k, v in os.environ.items() if k not in DEV_PATH_VARIABLES}, **extra}


@pytest.mark.slow
def test_the_wheel_ships_the_packages_data_and_no_compiled_recorder(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".so")], names
    for package in PACKAGES:
        assert f"{package}/py.typed" in names and f"{package}/__init__.py" in names, package
    assert {"modelplex/server/status_page/index.html", "modelplex/server/status_page/app.js",
            "modelplex_native_gpu/kernels/csrc/paged_attention.cpp"} <= set(names)  # C++ built where it runs


@pytest.mark.slow
def test_the_command_runs_without_dev_packages(venv_bin, tmp_path):
    assert run(venv_bin / "modelplex", "--version", cwd=tmp_path).strip() == "modelplex 0.1.0"
    help_text = run(venv_bin / "modelplex", "serve", "--help", cwd=tmp_path)
    assert "--model-repository" in help_text and "--model-control-mode" in help_text and "--admin-token" in help_text
    probe = ("import importlib, importlib.metadata as m, importlib.util, sys\n"
             f"for p in {PACKAGES!r}:\n"
             "    assert importlib.import_module(p).__file__.startswith(sys.prefix), p\n"
             "assert not [p for p in ('pytest', 'openai', 'torch') if importlib.util.find_spec(p)]\n"
             "from modelplex.observability import trace_spans\n"
             "print(trace_spans.SPAN_RECORDER, trace_spans.Recorder.__module__)\n"
             "print(*sorted(ep.name for ep in m.entry_points(group='modelplex')))\n")
    recorder, plugins = run(venv_bin / "python", "-c", probe, cwd=tmp_path).splitlines()
    assert recorder == "python modelplex.observability.py_span_recorder"
    assert plugins.split() == ["admin", "ensemble", "native_gpu", "onnx", "openvino", "python", "pytorch"]


@pytest.mark.slow
def test_the_installed_server_serves_and_traces_an_onnx_model(venv_bin, tmp_path, monkeypatch):
    from build_repository import build  # the `onnx` of the test venv writes the model; the server only reads it

    build(tmp_path / "repo", ["simple"])
    monkeypatch.chdir(tmp_path)  # nothing importable in the working directory of the server or its exporter
    for name in DEV_PATH_VARIABLES:  # ServerProcess passes on this environment
        monkeypatch.delenv(name, raising=False)
    httpd, posts = receiver()
    trace = ["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1", "--trace-config",
             f"opentelemetry,url=http://127.0.0.1:{httpd.server_port}/v1/traces", "--trace-config",
             "opentelemetry,bsp_schedule_delay=100"]
    a, b = list(range(16)), [2] * 16
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a},
                       {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b}]}
    try:
        with ServerProcess([tmp_path / "repo"], *trace, command=[str(venv_bin / "modelplex")]) as server:
            base = f"http://{server.http_url}"
            assert httpx.get(f"{base}/v2/health/ready").status_code == 200
            answer = httpx.post(f"{base}/v2/models/simple/infer", json=body)
            assert answer.status_code == 200, answer.text
            outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
            assert outputs == {"OUTPUT0": [x + 2 for x in a], "OUTPUT1": [x - 2 for x in a]}
            deadline = time.monotonic() + 20
            while sum(map(len, posts)) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        httpd.shutdown()
    assert sorted(n for post in posts for n in post) == ["POST /v2/models/simple/infer", "compute", "infer simple",
                                                         "queue"], server.log()


def test_repo_root_does_not_shadow_stdlib_platform():
    out = subprocess.run([sys.executable, "-c", "import platform; print(platform.system())"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    assert out.strip() == "Linux"
