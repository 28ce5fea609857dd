"""Dynamic batching through the real server: fewer backend calls than requests, Triton's queue
policies (full queue, timeouts, priorities) answered fast with 503, and the unbatched path unchanged."""
from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.int32)

VARIANTS = {
    "batched": "dynamic_batching { max_queue_delay_microseconds: 50000 }",
    "queue_of_one": """dynamic_batching { max_queue_delay_microseconds: 1000000
                       default_queue_policy { max_queue_size: 1 } }""",
    "timeout": """dynamic_batching { max_queue_delay_microseconds: 1000000
                  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000 } }""",
    "delay": """dynamic_batching { max_queue_delay_microseconds: 300000
               default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 50000 } }""",
    "preferred": """dynamic_batching { max_queue_delay_microseconds: 2000000 preferred_batch_size: [ 2 ] }""",
    "override": """dynamic_batching { max_queue_delay_microseconds: 500000
                   default_queue_policy { allow_timeout_override: true } }""",
    "priorities": """dynamic_batching { max_queue_delay_microseconds: 500000 priority_levels: 2
                     default_priority_level: 2 priority_queue_policy { key: 1 value { max_queue_size: 1 } } }""",
}


@pytest.fixture(scope="module")
def server(example_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("batching_repo")
    shutil.copytree(example_repo / "simple", repo / "simple")
    for variant, batching in VARIANTS.items():
        name = f"simple_{variant}"
        shutil.copytree(example_repo / "simple", repo / name)
        config = (repo / name / "config.pbtxt").read_text().replace('name: "simple"', f'name: "{name}"')
        (repo / name / "config.pbtxt").write_text(config + batching + "\n")
    with ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", "*") as s:
        yield s


def client(server, protocol):
    return (httpclient.InferenceServerClient(server.http_url) if protocol == "http"
            else grpcclient.InferenceServerClient(server.grpc_url))


def infer(server, protocol, model, a=A, **kwargs):
    module = httpclient if protocol == "http" else grpcclient
    inputs = [module.InferInput("INPUT0", list(a.shape), "INT32"), module.InferInput("INPUT1", list(a.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones_like(a))
    return client(server, protocol).infer(model, inputs, **kwargs)


def statistics(server, model) -> dict:
    return client(server, "http").get_inference_statistics(model)["model_stats"][0]


def infer_concurrently(server, protocol, model, num_requests):
    """`num_requests` different requests at once from as many threads; returns (inputs, results)."""
    arrays = [A + 100 * i for i in range(num_requests)]
    barrier = threading.Barrier(num_requests)

    def one(a):
        barrier.wait()
        return infer(server, protocol, model, a)

    with ThreadPoolExecutor(num_requests) as pool:
        return arrays, list(pool.map(one, arrays))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_concurrent_requests_run_in_fewer_backend_calls_and_get_their_own_answers(server, protocol):
    before = statistics(server, "simple_batched")
    arrays, results = infer_concurrently(server, protocol, "simple_batched", 16)
    for a, result in zip(arrays, results):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 1)
    after = statistics(server, "simple_batched")
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 16
    assert executions < inferences, f"{executions} backend calls for {inferences} inferences"
    assert max(b["batch_size"] for b in after["batch_stats"]) > 1
    # Queue time is recorded per request, compute per batch.
    assert after["inference_stats"]["queue"]["count"] == after["inference_stats"]["success"]["count"]
    assert sum(b["compute_infer"]["count"] for b in after["batch_stats"]) == after["execution_count"]


def test_requests_with_different_shapes_are_not_merged_and_all_answered(server):
    arrays = [np.arange(16 * n, dtype=np.int32).reshape(n, 16) for n in (1, 2, 3, 4)] * 2
    with ThreadPoolExecutor(len(arrays)) as pool:
        results = list(pool.map(lambda a: infer(server, "http", "simple_batched", a), arrays))
    for a, result in zip(arrays, results):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)


def test_without_dynamic_batching_every_request_is_its_own_backend_call(server):
    before = statistics(server, "simple")
    infer_concurrently(server, "http", "simple", 8)
    after = statistics(server, "simple")
    assert after["execution_count"] - before["execution_count"] == 8
    assert after["inference_count"] - before["inference_count"] == 8


def run_in_background(fn):
    result = {}

    def target():
        try:
            result["value"] = fn()
        except Exception as e:
            result["error"] = e

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


@pytest.mark.parametrize("protocol, status", [("http", "503"), ("grpc", "StatusCode.UNAVAILABLE")])
def test_a_full_queue_rejects_at_once_with_503(server, protocol, status):
    waiting, first = run_in_background(lambda: infer(server, protocol, "simple_queue_of_one"))
    time.sleep(0.3)  # the first request now waits in the queue for batch mates (up to 1 s)
    start = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        infer(server, protocol, "simple_queue_of_one")
    assert time.monotonic() - start < 0.5
    assert e.value.status() == status
    assert "the queue holds its maximum of 1 requests" in e.value.message()
    waiting.join(5)
    np.testing.assert_array_equal(first["value"].as_numpy("OUTPUT0"), A + 1)


def test_a_full_queue_answers_http_with_retry_after(server):
    waiting, _ = run_in_background(lambda: infer(server, "http", "simple_queue_of_one"))
    time.sleep(0.3)
    body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                       for n in ("INPUT0", "INPUT1")]}
    response = httpx.post(f"http://{server.http_url}/v2/models/simple_queue_of_one/infer", json=body)
    waiting.join(5)
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1


@pytest.mark.parametrize("protocol, status", [("http", "503"), ("grpc", "StatusCode.UNAVAILABLE")])
def test_a_request_past_its_queue_timeout_is_rejected_with_503_not_kept(server, protocol, status):
    before = statistics(server, "simple_timeout")
    start = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        infer(server, protocol, "simple_timeout")
    elapsed = time.monotonic() - start
    assert 0.09 < elapsed < 0.8, elapsed  # the 100 ms timeout, well before the 1 s batching delay
    assert e.value.status() == status and "request timeout expired" in e.value.message()
    after = statistics(server, "simple_timeout")
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"] + 1
    assert after["execution_count"] == before["execution_count"]


def test_a_preferred_batch_size_runs_at_once_instead_of_waiting_out_the_delay(server):
    start = time.monotonic()
    arrays, results = infer_concurrently(server, "http", "simple_preferred", 2)
    assert time.monotonic() - start < 1.5  # the 2 s delay was not waited out
    for a, result in zip(arrays, results):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
    assert [b["batch_size"] for b in statistics(server, "simple_preferred")["batch_stats"]] == [2]


def test_a_request_past_its_timeout_under_delay_is_still_answered(server):
    start = time.monotonic()
    result = infer(server, "grpc", "simple_delay")
    assert time.monotonic() - start >= 0.25  # it waited out the batching delay, not rejected at 50 ms
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + 1)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_timeout_parameter_shortens_the_wait_when_overrides_are_allowed(server, protocol):
    with pytest.raises(InferenceServerException, match="request timeout expired"):
        infer(server, protocol, "simple_override", timeout=50_000)
    start = time.monotonic()
    result = infer(server, protocol, "simple_override")  # no timeout: waits out the 0.5 s delay, then runs
    assert time.monotonic() - start >= 0.4
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + 1)


def test_a_priority_parameter_picks_the_queue_and_its_policy(server):
    waiting, first = run_in_background(lambda: infer(server, "grpc", "simple_priorities", priority=1))
    time.sleep(0.2)
    with pytest.raises(InferenceServerException, match="maximum of 1 requests"):
        infer(server, "grpc", "simple_priorities", priority=1)  # level 1 holds one request at most
    default_level = infer(server, "grpc", "simple_priorities")  # level 2 has no limit
    beyond = infer(server, "grpc", "simple_priorities", priority=9)  # Triton: beyond the levels = default
    waiting.join(5)
    for result in (first["value"], default_level, beyond):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - 1)


@pytest.mark.parametrize("parameters, match", [({"priority": "high"}, "'priority' must be a non-negative integer"),
                                               ({"timeout": -5}, "'timeout' must be a non-negative integer")])
def test_bad_priority_or_timeout_parameters_are_400(server, parameters, match):
    body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                       for n in ("INPUT0", "INPUT1")], "parameters": parameters}
    response = httpx.post(f"http://{server.http_url}/v2/models/simple_priorities/infer", json=body)
    assert response.status_code == 400 and match in response.json()["error"]
    np.testing.assert_array_equal(infer(server, "http", "simple_batched").as_numpy("OUTPUT0"), A + 1)
