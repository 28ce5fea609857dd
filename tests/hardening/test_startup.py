"""Issue 29, a startup an operator can read: --exit-on-error, clear one-line errors (missing repository,
--load-model of a missing model, a name in two repositories, a port in use), readiness only once the
startup load ended, what loaded and how long it took, an optional access log, clean JSON logs, help with
defaults, API docs, and poll mode logging a failing model once until its files change."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.serverproc import ServerProcess

from modelplex.server.cli import build_parser

ONNX = {"MODELPLEX_PLUGINS": "onnx"}
GATED = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(3)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
'''
PYTHON_CONFIG = ('backend: "python"\ninput [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
                 'output [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_serve(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`modelplex serve` on free ports, expected to exit by itself."""
    cmd = [sys.executable, "-m", "modelplex", "serve", "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
           "--metrics-port", "0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or ONNX)})


@pytest.fixture
def broken_repo(repo_copy):
    (repo_copy / "broken" / "1").mkdir(parents=True)
    (repo_copy / "broken" / "1" / "model.onnx").write_bytes(b"not onnx")
    (repo_copy / "broken" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    return repo_copy


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str, traceback: bool = False) -> None:
    """Exit status 1 and a line holding every needle; no traceback unless the failure is a model's own
    (its load error is logged with it)."""
    assert result.returncode == 1, result.stderr
    assert traceback or "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if all(n in line for n in needles)]
    assert lines, result.stderr


def test_a_failed_startup_model_exits_non_zero_unless_exit_on_error_is_false(broken_repo):
    result = run_serve("--model-repository", str(broken_repo))
    assert_one_line_error(result, "failed to load at startup (--exit-on-error)", "broken", traceback=True)
    with ServerProcess([broken_repo], "--exit-on-error=false", env=ONNX) as s:
        assert httpx.get(f"http://{s.http_url}/v2/models/simple/ready", timeout=10).status_code == 200
        assert httpx.get(f"http://{s.http_url}/v2/models/broken/ready", timeout=10).status_code == 400


def test_startup_errors_are_one_line_naming_what_to_fix(example_repo, repo_copy, tmp_path):
    missing = tmp_path / "no-such-repo"
    assert_one_line_error(run_serve("--model-repository", str(missing)), str(missing), "--model-repository")
    assert_one_line_error(run_serve("--model-repository", str(example_repo), "--model-control-mode", "explicit",
                                    "--load-model", "nope"), "nope", "not in the model repository")
    assert_one_line_error(run_serve("--model-repository", str(example_repo), "--model-repository", str(repo_copy)),
                          "in more than one model repository", str(example_repo / "simple"), str(repo_copy / "simple"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "modelplex", "serve", "--host", "127.0.0.1", "--model-repository",
                                 str(example_repo), "--http-port", str(port), "--grpc-port", "0", "--metrics-port", "0"],
                                capture_output=True, text=True, timeout=60, env={**os.environ, **ONNX})
    assert_one_line_error(result, f"cannot listen on 127.0.0.1:{port} (--http-port)")


def test_readiness_polled_every_10_ms_from_process_start_waits_for_the_startup_models(example_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(example_repo / "simple", repo / "simple")
    (repo / "gated" / "1").mkdir(parents=True)
    (repo / "gated" / "1" / "model.py").write_text(GATED)
    (repo / "gated" / "config.pbtxt").write_text(PYTHON_CONFIG)
    http, grpc_port = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "modelplex", "serve", "--host", "127.0.0.1", "--model-repository",
                               str(repo), "--http-port", str(http), "--grpc-port", str(grpc_port), "--metrics-port", "0",
                               "--strict-readiness=false"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "MODELPLEX_PLUGINS": "onnx,python"})
    seen = {"http": [], "grpc": []}

    def poll_grpc():
        stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
        while server.poll() is None and not seen["grpc"]:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status == 1:
                    seen["grpc"].append(httpx.get(f"http://127.0.0.1:{http}/v2/models/gated/ready").status_code)
            except (grpc.RpcError, httpx.TransportError):
                pass
            time.sleep(0.01)

    poller = threading.Thread(target=poll_grpc)
    poller.start()
    try:
        deadline = time.monotonic() + 90
        with httpx.Client(base_url=f"http://127.0.0.1:{http}", timeout=2) as client:
            while not seen["http"] and time.monotonic() < deadline:
                try:
                    if client.get("/v2/health/ready").status_code == 200:
                        # The model must be READY when the server first says ready.
                        seen["http"].append(client.get("/v2/models/gated/ready").status_code)
                except httpx.TransportError:
                    pass
                time.sleep(0.01)
        poller.join(30)
        assert seen == {"http": [200], "grpc": [200]}
    finally:
        server.terminate()
        server.wait(60)


def test_the_log_says_where_it_listens_what_loaded_and_each_access(example_repo):
    with ServerProcess([example_repo], "--access-log", env=ONNX) as s:
        httpx.get(f"http://{s.http_url}/v2/models/simple/ready", timeout=10)
        body = {"id": "req-7", "inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                                          for n in ("INPUT0", "INPUT1")]}
        httpx.post(f"http://{s.http_url}/v2/models/simple/infer", json=body, timeout=10)
        time.sleep(0.3)
        log = s.log()
    assert f"HTTP listening on 127.0.0.1:{s.ports['http']}" in log
    assert f"gRPC listening on 127.0.0.1:{s.ports['grpc']}" in log
    assert f"metrics listening on 127.0.0.1:{s.ports['metrics']}" in log
    assert "model simple version 1 ready in " in log
    table = log[log.index("startup load ended"):]
    assert "MODEL" in table and "STATE" in table and "simple_string  1        READY" in table
    assert "GET /v2/models/simple/ready model=simple status=200" in log
    assert "POST /v2/models/simple/infer model=simple status=200" in log and "request_id=req-7" in log


def test_json_logs_leave_no_plain_text_line(example_repo, tmp_path):
    port_file = tmp_path / "ports.json"
    proc = subprocess.Popen([sys.executable, "-m", "modelplex", "serve", "--host", "127.0.0.1", "--model-repository",
                             str(example_repo), "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
                             "--log-format", "json", "--port-file", str(port_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **ONNX})
    deadline = time.monotonic() + 60
    while not port_file.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.terminate()
    out, err = proc.communicate(timeout=60)
    for line in (out + err).splitlines():
        assert isinstance(json.loads(line), dict), line
    assert any("modelplex serving" in json.loads(line)["message"] for line in err.splitlines())


def test_serve_help_shows_every_flag_with_help_and_defaults():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    undocumented = [a.option_strings[0] for a in serve._actions if a.option_strings and not a.help]
    assert not undocumented, f"flags without help: {undocumented}"
    text = serve.format_help()
    assert "(default: 8000)" in text and "(default: True)" in text


def test_docs_page_is_served_without_any_other_host(example_repo):
    with ServerProcess([example_repo], env=ONNX) as s:
        r = httpx.get(f"http://{s.http_url}/docs", timeout=10)
        assert r.status_code == 200 and "/openapi.json" in r.text
        assert "http://" not in r.text and "https://" not in r.text  # nothing fetched from elsewhere
        assert httpx.get(f"http://{s.http_url}/openapi.json", timeout=10).status_code == 200


def _load_errors(log: str) -> int:
    """ERROR lines about the broken model's load (the startup table repeats its reason at INFO)."""
    return sum(" ERROR " in line and "failed to load 'broken'" in line for line in log.splitlines())


def test_poll_mode_logs_a_failing_model_once_until_its_files_change(broken_repo):
    with ServerProcess([broken_repo], "--model-control-mode", "poll", "--repository-poll-secs", "0.2",
                       "--exit-on-error=false", env=ONNX) as s:
        time.sleep(2)
        assert _load_errors(s.log()) == 1
        (broken_repo / "broken" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 0\n')
        deadline = time.monotonic() + 10
        while _load_errors(s.log()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        assert _load_errors(s.log()) == 2
