"""Triton's nv_inference_* semantics on a real server, scraped with prometheus_client's parser before
and after known traffic: exact increments per model and version, failures by `reason`, inference vs
execution counts under dynamic batching, durations, the pending gauge under load, load durations
and the per-ensemble-step series."""
from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from helpers.serverproc import ServerProcess
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

MODELS = Path(__file__).resolve().parents[1] / "python_backend" / "models"
SLEEP_MS = 600
BATCH_DELAY_US = 300_000
SLEEPY_CONFIG = """name: "sleepy"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "ARGS" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "execute_timeout_secs" value { string_value: "30" } }
"""
BATCHING = f"""dynamic_batching {{
  max_queue_delay_microseconds: {BATCH_DELAY_US}
  default_queue_policy {{ timeout_action: REJECT allow_timeout_override: true }}
}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from build_repository import build

    repo = tmp_path_factory.mktemp("metrics_repo")
    build(repo, ["simple", "ensemble_add_sub"])
    shutil.copytree(repo / "simple", repo / "simple_batched")
    config = (repo / "simple" / "config.pbtxt").read_text().replace('name: "simple"', 'name: "simple_batched"')
    (repo / "simple_batched" / "config.pbtxt").write_text(config + BATCHING)
    shutil.copytree(MODELS / "sleepy", repo / "sleepy")
    (repo / "sleepy" / "config.pbtxt").write_text(SLEEPY_CONFIG)
    shutil.copytree(MODELS / "faulty", repo / "faulty")
    with ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", "*") as s:
        yield s


def scrape(server) -> dict[tuple, float]:
    """Samples by (family name, labels): the parser names Triton's counters' samples `*_total`."""
    samples = {}
    for family in text_string_to_metric_families(httpx.get(server.metrics_url).text):
        for s in family.samples:
            name = family.name if s.name == family.name + "_total" else s.name
            samples[(name, tuple(sorted(s.labels.items())))] = s.value
    return samples


class Delta:
    """Differences of one model version's series between two scrapes."""

    def __init__(self, before: dict, after: dict, model: str, version: str = "1"):
        self.before, self.after, self.labels = before, after, {"model": model, "version": version}

    def __call__(self, name: str, **extra) -> float:
        key = (name, tuple(sorted({**self.labels, **extra}.items())))
        return self.after.get(key, 0.0) - self.before.get(key, 0.0)


def simple_inputs(batch: int, module=httpclient):
    inputs = [module.InferInput(n, [batch, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(np.ones((batch, 16), np.int32))
    return inputs


def sleepy_inputs(ms: int, module=httpclient):
    x = module.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([ms], np.int32))
    return [x]


def test_requests_inferences_executions_and_failures_per_model(server):
    client = httpclient.InferenceServerClient(server.http_url)
    before = scrape(server)
    for batch in (1, 3, 8):
        client.infer("simple", simple_inputs(batch))
    bad = simple_inputs(2)
    bad[0] = httpclient.InferInput("INPUT0", [2, 16], "FP32")
    bad[0].set_data_from_numpy(np.ones((2, 16), np.float32))
    with pytest.raises(InferenceServerException):
        client.infer("simple", bad)  # invalid: OTHER
    mode = httpclient.InferInput("MODE", [1], "BYTES")
    mode.set_data_from_numpy(np.array([b"raise"], np.object_))
    with pytest.raises(InferenceServerException, match="broke on purpose"):
        client.infer("faulty", [mode])  # the model fails: BACKEND
    client.infer("ensemble_add_sub", simple_inputs(2))
    after = scrape(server)

    simple = Delta(before, after, "simple")
    assert simple("nv_inference_request_success") == 3 + 4  # 3 direct requests, 4 ensemble steps
    assert simple("nv_inference_count") == 1 + 3 + 8 + 4 * 2
    assert simple("nv_inference_exec_count") == 3 + 4
    assert simple("nv_inference_request_failure", reason="OTHER") == 1
    for reason in ("BACKEND", "REJECTED", "CANCELED"):
        assert simple("nv_inference_request_failure", reason=reason) == 0
    assert simple("nv_inference_request_duration_us") >= simple("nv_inference_compute_infer_duration_us") > 0
    assert simple("nv_inference_compute_input_duration_us") == simple("nv_inference_compute_output_duration_us") == 0

    faulty = Delta(before, after, "faulty")
    assert faulty("nv_inference_request_failure", reason="BACKEND") == 1
    assert faulty("nv_inference_request_success") == 0

    ensemble = Delta(before, after, "ensemble_add_sub")
    assert ensemble("nv_inference_request_success") == 1 and ensemble("nv_inference_count") == 2
    for step in ("1", "2", "3", "4"):
        assert ensemble("modelplex_ensemble_step_count", step=step, step_model="simple") == 1
        assert ensemble("modelplex_ensemble_step_duration_us", step=step, step_model="simple") > 0
    step_us = {s: ensemble("modelplex_ensemble_step_duration_us", step=s, step_model="simple") for s in "1234"}
    # Steps 3 and 4 both wait only for step 2, so they may overlap (they do when a slow run sends `simple` to
    # its thread): the chain 1 -> 2 -> the longer of 3 and 4 fits in the ensemble's time, not all four.
    assert step_us["1"] + step_us["2"] + max(step_us["3"], step_us["4"]) <= ensemble("nv_inference_request_duration_us")

    for model in ("simple", "simple_batched", "sleepy", "faulty", "ensemble_add_sub"):
        assert after[("nv_model_load_duration_secs", (("model", model), ("version", "1")))] > 0
    assert 0.0 <= after[("nv_cpu_utilization", ())] <= 1.0
    assert 0 < after[("nv_cpu_memory_used_bytes", ())] <= after[("nv_cpu_memory_total_bytes", ())]


def test_dynamic_batching_counts_one_execution_and_rejects_expired_requests(server):
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    before = scrape(server)
    # Four requests inside one queue delay: one execution of batch 4.
    futures = [client.async_infer("simple_batched", simple_inputs(1)) for _ in range(4)]
    for f in futures:
        f.get_result()
    # A request whose queue timeout (1 µs) ends while the batcher waits for more: REJECTED.
    with pytest.raises(InferenceServerException, match="request timeout expired"):
        client.infer("simple_batched", simple_inputs(1), timeout=1)
    after = scrape(server)
    batched = Delta(before, after, "simple_batched")
    assert batched("nv_inference_request_success") == 4
    assert batched("nv_inference_count") == 4
    assert batched("nv_inference_exec_count") == 1
    assert batched("nv_inference_request_failure", reason="REJECTED") == 1
    # Each of the four waited for the batch to fill (up to the queue delay).
    assert batched("nv_inference_queue_duration_us") >= 4 * 0.5 * BATCH_DELAY_US * 0.5


def test_pending_gauge_counts_requests_awaiting_execution(server):
    """One instance, three requests of 600 ms at once: one executes, two wait (Triton's pending
    count), then the gauge falls back to 0; their queueing shows in the queue duration."""
    labels = (("model", "sleepy"), ("version", "1"))
    before = scrape(server)
    seen, done = [], threading.Event()

    def watch():
        while not done.is_set():
            seen.append(scrape(server)[("nv_inference_pending_request_count", labels)])
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(3) as pool:
        clients = [httpclient.InferenceServerClient(server.http_url) for _ in range(3)]
        list(pool.map(lambda c: c.infer("sleepy", sleepy_inputs(SLEEP_MS)), clients))
    done.set()
    watcher.join()
    after = scrape(server)
    assert max(seen) == 2, seen
    assert after[("nv_inference_pending_request_count", labels)] == 0
    sleepy = Delta(before, after, "sleepy")
    assert sleepy("nv_inference_request_success") == 3 and sleepy("nv_inference_exec_count") == 3
    assert sleepy("nv_inference_compute_infer_duration_us") >= 3 * SLEEP_MS * 1000
    # The second waited ~1 sleep, the third ~2.
    assert sleepy("nv_inference_queue_duration_us") >= 2.5 * SLEEP_MS * 1000


def test_a_client_that_gives_up_counts_as_canceled(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    before = scrape(server)
    with pytest.raises(InferenceServerException, match="Deadline"):
        client.infer("sleepy", sleepy_inputs(SLEEP_MS, grpcclient), client_timeout=0.2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = scrape(server)
        if Delta(before, after, "sleepy")("nv_inference_request_failure", reason="CANCELED"):
            break
        time.sleep(0.1)
    sleepy = Delta(before, after, "sleepy")
    assert sleepy("nv_inference_request_failure", reason="CANCELED") == 1
    assert sleepy("nv_inference_request_success") == 0
    # The instance is usable again afterwards.
    assert client.infer("sleepy", sleepy_inputs(1, grpcclient)).as_numpy("PID")[0] > 0
