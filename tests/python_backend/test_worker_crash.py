"""A Python worker that dies or hangs takes down only its own instance: the model reports UNAVAILABLE with
the reason, its in-flight requests fail at once, other models keep answering, and a reload brings it back."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from helpers.python_clients import SERVER_ENV, http_infer, inputs, load_args
from helpers.serverproc import ServerProcess


@pytest.fixture(scope="module")
def server(python_repo):
    with ServerProcess([python_repo], *load_args(["simple", "whoami", "sleepy"]), env=SERVER_ENV) as s:
        yield s


def worker_pid(server, model: str) -> int:
    return int(http_infer(server, model, X=np.zeros(1, np.int32)).as_numpy("PID")[0])


def wait_for_state(client, model: str, state: str, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        row = next(r for r in client.get_model_repository_index() if r["name"] == model)
        if row.get("state") == state or time.monotonic() > deadline:
            return row
        time.sleep(0.05)


def assert_simple_answers(server) -> None:
    a = np.arange(16, dtype=np.int32)[None]
    result = httpclient.InferenceServerClient(server.http_url).infer("simple", inputs(httpclient, INPUT0=a, INPUT1=a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def test_a_killed_worker_makes_the_model_unavailable_until_reloaded(server):
    client = httpclient.InferenceServerClient(server.http_url)
    pid = worker_pid(server, "whoami")
    os.kill(pid, signal.SIGKILL)
    row = wait_for_state(client, "whoami", "UNAVAILABLE")
    assert row["state"] == "UNAVAILABLE"
    assert row["reason"] == "python worker for whoami_0_0 exited with signal 9 (SIGKILL)"
    assert not client.is_model_ready("whoami")
    with pytest.raises(httpclient.InferenceServerException) as e:
        worker_pid(server, "whoami")
    assert e.value.status() == "503" and "whoami" in e.value.message()
    assert_simple_answers(server)

    client.load_model("whoami")
    assert client.is_model_ready("whoami")
    assert worker_pid(server, "whoami") != pid
    assert wait_for_state(client, "whoami", "READY")["reason"] == ""


def test_requests_in_flight_on_a_dying_worker_fail_at_once(server):
    pid = worker_pid(server, "whoami")
    outcome = {}

    def slow_request():
        start = time.monotonic()
        try:
            http_infer(server, "whoami", X=np.array([20_000], np.int32))  # 20 s in execute
        except httpclient.InferenceServerException as e:
            outcome["error"] = e
        outcome["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=slow_request)
    thread.start()
    time.sleep(0.5)  # the request is in the worker's execute now
    os.kill(pid, signal.SIGKILL)
    thread.join(10)
    assert outcome["seconds"] < 5
    error = outcome["error"]
    assert error.status() == "500"
    assert "model 'whoami'" in error.message() and "exited with signal 9" in error.message()
    assert_simple_answers(server)
    httpclient.InferenceServerClient(server.http_url).load_model("whoami")
    assert worker_pid(server, "whoami") != pid


def test_a_hung_execute_times_out_and_its_worker_is_killed(server):
    client = httpclient.InferenceServerClient(server.http_url)
    pid = worker_pid(server, "sleepy")
    start = time.monotonic()
    with pytest.raises(httpclient.InferenceServerException) as e:
        http_infer(server, "sleepy", X=np.array([60_000], np.int32))  # config: execute_timeout_secs 1
    assert time.monotonic() - start < 5
    assert e.value.status() == "500"
    assert "model 'sleepy'" in e.value.message() and "did not finish execute within 1 s" in e.value.message()
    row = wait_for_state(client, "sleepy", "UNAVAILABLE")
    assert row["reason"] == "python worker for sleepy_0_0 did not finish execute within 1 s and was killed"
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # the kill lands within moments
            os.kill(pid, 0)
            time.sleep(0.05)
    assert_simple_answers(server)
    client.load_model("sleepy")
    assert worker_pid(server, "sleepy") != pid


def test_each_instance_has_a_worker_of_its_own(server):
    from concurrent.futures import ThreadPoolExecutor

    client = httpclient.InferenceServerClient(server.http_url)
    config = client.get_model_config("whoami")
    config["instance_group"] = [{"kind": "KIND_CPU", "count": 2}]
    client.load_model("whoami", config=json.dumps(config))
    try:
        def pid_after(ms: int) -> int:
            return int(http_infer(server, "whoami", X=np.array([ms], np.int32)).as_numpy("PID")[0])

        with ThreadPoolExecutor(2) as pool:  # two slow requests at once: one on each instance
            pids = set(pool.map(pid_after, [500, 500]))
        assert len(pids) == 2
        os.kill(pids.pop(), signal.SIGKILL)
        row = wait_for_state(client, "whoami", "UNAVAILABLE")
        assert row["reason"].startswith("python worker for whoami_0_") and "signal 9" in row["reason"]
    finally:
        client.load_model("whoami")  # back to the repository's config
    assert worker_pid(server, "whoami") not in pids
