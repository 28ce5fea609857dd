"""SIGTERM during running requests and streams: not ready within 1 s, new requests refused, every
in-flight request and stream finishes, exit code 0; and `--exit-timeout-secs` bounds the wait."""
from __future__ import annotations

import shutil
import signal
import threading
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.serverproc import ServerProcess
from helpers.stream_clients import repeat_stream
from tritonclient.utils import InferenceServerException

REPEAT = Path(__file__).resolve().parent.parent / "python_backend" / "models" / "repeat_int32"
ENV = {"MODELPLEX_PLUGINS": "python"}
SLOW_CONFIG = """name: "slow"
backend: "python"
input [ { name: "MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"""
SLOW_MODEL = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            ms = pb_utils.get_input_tensor_by_name(request, "MS").as_numpy()
            time.sleep(ms[0] / 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", ms)]))
        return responses
'''


@pytest.fixture(scope="module")
def slow_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("lifecycle_repo")
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    (repo / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    shutil.copytree(REPEAT, repo / "repeat_int32")
    return repo


def start(repo: Path, exit_timeout: float) -> ServerProcess:
    return ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", "slow",
                         "--load-model", "repeat_int32", "--exit-timeout-secs", str(exit_timeout), env=ENV)


def slow_infer(url: str, ms: int) -> int:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    tensor = httpclient.InferInput("MS", [1], "INT32")
    tensor.set_data_from_numpy(np.array([ms], np.int32))
    return int(client.infer("slow", [tensor]).as_numpy("OUT")[0])


def run_in_threads(calls) -> tuple[list[threading.Thread], dict]:
    results: dict = {}

    def run(key, fn, *args):
        try:
            results[key] = fn(*args)
        except Exception as e:
            results[key] = e

    threads = [threading.Thread(target=run, args=(key, *call)) for key, call in calls.items()]
    for t in threads:
        t.start()
    return threads, results


def grpc_health(url: str) -> int:
    with grpc.insecure_channel(url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status


NUM_STREAMS = 50


def test_sigterm_drains_requests_and_streams(slow_repo):
    with start(slow_repo, exit_timeout=30) as s:
        http_url = f"http://{s.http_url}"
        assert httpx.get(f"{http_url}/v2/health/ready").status_code == 200
        # 50 streams of 12 responses 500 ms apart, signalled once every one is running (has answered once).
        started = threading.Semaphore(0)
        calls = {f"stream{i}": (repeat_stream, s.grpc_url, [i + 100 * k for k in range(12)], 500, started)
                 for i in range(NUM_STREAMS)}
        threads, results = run_in_threads(calls)
        for _ in range(NUM_STREAMS):
            assert started.acquire(timeout=60), f"streams never started: {results}"
        # 6 requests of 1.5 s on 2 instances: 4.5 s of work, most of it still queued at the signal.
        more_threads, more_results = run_in_threads({f"infer{i}": (slow_infer, s.http_url, 1500 + i) for i in range(6)})
        threads += more_threads
        time.sleep(0.5)
        assert not results and not more_results, f"calls ended before the signal: {results} {more_results}"
        s.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        while httpx.get(f"{http_url}/v2/health/ready").status_code != 400:
            assert time.monotonic() - signalled < 1.0, "HTTP readiness still true 1 s after SIGTERM"
            time.sleep(0.02)
        while grpc_health(s.grpc_url) != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() - signalled < 1.0, "gRPC health still SERVING 1 s after SIGTERM"
            time.sleep(0.02)
        assert time.monotonic() - signalled < 1.0

        refused = httpx.post(f"{http_url}/v2/models/slow/infer", json={"inputs": [
            {"name": "MS", "shape": [1], "datatype": "INT32", "data": [1]}]})
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]
        with pytest.raises(InferenceServerException) as grpc_refused:
            tensor = grpcclient.InferInput("MS", [1], "INT32")
            tensor.set_data_from_numpy(np.array([1], np.int32))
            grpcclient.InferenceServerClient(s.grpc_url).infer("slow", [tensor])
        assert grpc_refused.value.status() == "StatusCode.UNAVAILABLE"

        for t in threads:
            t.join(60)
        assert s.proc.wait(30) == 0, s.log()
        took = time.monotonic() - signalled
        assert more_results == {f"infer{i}": 1500 + i for i in range(6)}
        for i in range(NUM_STREAMS):
            assert results[f"stream{i}"] == [i + 100 * k for k in range(12)] + ["FINAL"], i
        assert took >= 3.0, f"exited {took:.1f}s after SIGTERM: before the queued requests could finish"


def test_exit_timeout_bounds_the_drain(slow_repo):
    with start(slow_repo, exit_timeout=1) as s:
        threads, results = run_in_threads({"long": (slow_infer, s.http_url, 20_000)})
        time.sleep(0.5)
        s.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert s.proc.wait(30) == 0, s.log()
        took = time.monotonic() - signalled
        threads[0].join(30)
        assert 1.0 <= took < 12.0, f"exit {took:.1f}s after SIGTERM with --exit-timeout-secs 1:\n{s.log()}"
        assert isinstance(results["long"], Exception)


def test_sigterm_while_models_load_exits_promptly(tmp_path):
    """A pod scaled down while still loading must not sit out its whole grace period."""
    (tmp_path / "slow_init" / "1").mkdir(parents=True)
    (tmp_path / "slow_init" / "config.pbtxt").write_text(SLOW_CONFIG.replace('"slow"', '"slow_init"'))
    (tmp_path / "slow_init" / "1" / "model.py").write_text(
        "import time\n" + SLOW_MODEL.replace("    def execute", "    def initialize(self, args):\n"
                                             "        time.sleep(60)\n\n    def execute"))
    server = ServerProcess([tmp_path], "--exit-timeout-secs", "5", env=ENV, timeout=3)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="did not start"):
        server.start()  # gives up after 3 s; its stop() sends the SIGTERM under test
    took = time.monotonic() - started
    assert server.proc.returncode == 0, server.log()
    assert "abandoning the start" in server.log()
    assert took < 3 + 10, f"{took:.1f}s: the server finished loading (60 s) before stopping"
