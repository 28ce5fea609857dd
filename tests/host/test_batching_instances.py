"""Instance groups under dynamic batching: with `count: 2` two batches run at once, each on its own
instance. The model is a small plugin backend defined here whose runs take a known time."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient

import modelplex
from modelplex import BackendSpec, InferResponse, InferTensor, ModelInstance
from modelplex.core.plugins import create_plugin_manager
from modelplex.core.settings import ServerConfig
from modelplex.server.assembly import Server

CONFIG = """
name: "{name}"
backend: "slow"
max_batch_size: 4
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "RUNNING" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "INSTANCE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
dynamic_batching {{ }}
"""
RUN_SECONDS = 0.2


class SlowInstance(ModelInstance):
    """Each run takes RUN_SECONDS; RUNNING is how many runs of its model were under way when it began."""

    running: dict[str, int] = {}

    def __init__(self, ictx):
        self.model, self.index = ictx.model.name, ictx.index

    async def execute(self, requests):
        running = self.running[self.model] = self.running.get(self.model, 0) + 1
        try:
            await asyncio.sleep(RUN_SECONDS)
        finally:
            self.running[self.model] -= 1
        return [InferResponse("", "", [
            InferTensor.from_numpy("RUNNING", np.full((len(r.inputs[0].data), 1), running, np.int32)),
            InferTensor.from_numpy("INSTANCE", np.full((len(r.inputs[0].data), 1), self.index, np.int32))])
            for r in requests]


class SlowPlugin:
    @modelplex.hookimpl
    def modelplex_backends(self):
        return [BackendSpec(name="slow", create_instance=SlowInstance)]


def infer_concurrently(url, model, num_requests):
    barrier = threading.Barrier(num_requests)

    def one(i):
        client = httpclient.InferenceServerClient(url)
        x = httpclient.InferInput("X", [1, 1], "INT32")
        x.set_data_from_numpy(np.array([[i]], np.int32))
        barrier.wait()
        result = client.infer(model, [x])
        return int(result.as_numpy("RUNNING")[0, 0]), int(result.as_numpy("INSTANCE")[0, 0])

    with ThreadPoolExecutor(num_requests) as pool:
        return list(pool.map(one, range(num_requests)))


@pytest.mark.parametrize("count", [1, 2])
def test_each_instance_of_a_group_runs_its_own_batch_at_the_same_time(tmp_path, count):
    name = f"slow_{count}"
    (tmp_path / name / "1").mkdir(parents=True)
    (tmp_path / name / "config.pbtxt").write_text(CONFIG.format(name=name, count=count))

    async def scenario():
        settings = ServerConfig(model_repositories=[tmp_path], host="127.0.0.1", http_port=0, allow_grpc=False,
                                allow_metrics=False)
        server = Server(settings, create_plugin_manager(allow=set(), extra=[SlowPlugin()]))
        await server.start()
        try:
            url = f"127.0.0.1:{server.ports['http']}"
            answers = await asyncio.to_thread(infer_concurrently, url, name, 12)
            stats = server.dataplane.statistics(name)["model_stats"][0]
        finally:
            await server.stop()
        return answers, stats

    answers, stats = asyncio.run(scenario())
    assert max(running for running, _ in answers) == count  # never more runs at once than instances
    assert {instance for _, instance in answers} == set(range(count))  # every instance served
    assert stats["inference_count"] == 12
    assert stats["execution_count"] < 12  # requests that waited for a busy instance ran together
