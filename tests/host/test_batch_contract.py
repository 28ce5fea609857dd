"""The `execute` contract under dynamic batching, with plugin backends defined here: a request's own
error fails only that request (no rerun of its batch mates), a raise fails the whole call, and a
backend declaring `merges_batches` gets one request holding the batch's rows, split back per request."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import modelplex
from modelplex import BackendSpec, InferResponse, InferTensor, InvalidInput, ModelInstance
from modelplex.core.plugins import create_plugin_manager
from modelplex.core.settings import ServerConfig
from modelplex.server.assembly import Server

CONFIG = """
name: "{name}"
backend: "{backend}"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 2 ] }}, {{ name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 300000 preferred_batch_size: [ 4 ] }}
"""
CALLS: dict[str, list[list[int]]] = {}  # model -> rows of each request of each execute call


class Doubler(ModelInstance):
    """Y = 2X; ROWS = rows of the request as the backend saw it. A negative X is that request's
    error; X == 999 makes the whole call raise."""

    def __init__(self, ictx):
        self.model = ictx.model.name

    async def execute(self, requests):
        CALLS.setdefault(self.model, []).append([r.inputs[0].shape[0] for r in requests])
        await asyncio.sleep(0.01)
        results = []
        for r in requests:
            x = r.inputs[0].data
            if (x == 999).any():
                raise RuntimeError("the device fell over")
            if (x < 0).any():
                results.append(InvalidInput(f"model '{self.model}': X must not be negative"))
                continue
            rows = np.full((x.shape[0], 1), x.shape[0], np.int32)
            results.append(InferResponse("", "", [InferTensor.from_numpy("Y", 2 * x), InferTensor.from_numpy("ROWS", rows)]))
        return results


class Plugin:
    @modelplex.hookimpl
    def modelplex_backends(self):
        return [BackendSpec(name="doubler", create_instance=Doubler),
                BackendSpec(name="merging_doubler", create_instance=Doubler, merges_batches=True)]


def send_together(url: str, model: str, values: list[int]) -> list:
    """One request per value at once (X = [[v, v]]); each result is Y's array or the exception."""
    barrier = threading.Barrier(len(values))

    def one(v):
        x = httpclient.InferInput("X", [1, 2], "INT32")
        x.set_data_from_numpy(np.full((1, 2), v, np.int32))
        barrier.wait()
        try:
            return httpclient.InferenceServerClient(url).infer(model, [x])
        except InferenceServerException as e:
            return e

    with ThreadPoolExecutor(len(values)) as pool:
        return list(pool.map(one, values))


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    repo = tmp_path_factory.mktemp("contract_repo")
    for name, backend in (("plain", "doubler"), ("merged", "merging_doubler")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, backend=backend))
    ready, stop = threading.Event(), None
    box = {}

    async def serve():
        nonlocal stop
        stop = asyncio.Event()
        settings = ServerConfig(model_repositories=[repo], host="127.0.0.1", http_port=0, allow_grpc=False,
                                allow_metrics=False)
        server = Server(settings, create_plugin_manager(allow=set(), extra=[Plugin()]))
        await server.start()
        box["url"], box["loop"] = f"127.0.0.1:{server.ports['http']}", asyncio.get_running_loop()
        ready.set()
        await stop.wait()
        await server.stop()

    thread = threading.Thread(target=asyncio.run, args=(serve(),))
    thread.start()
    ready.wait(60)
    yield box["url"]
    box["loop"].call_soon_threadsafe(stop.set)
    thread.join(30)


@pytest.mark.parametrize("model", ["plain", "merged"])
def test_a_bad_request_fails_alone_and_its_batch_mates_are_answered(url, model):
    CALLS.pop(model, None)
    results = send_together(url, model, [1, -1, 3, 4])
    assert isinstance(results[1], InferenceServerException) and results[1].status() == "400"
    assert "must not be negative" in results[1].message()
    for v, result in zip([1, 3, 4], [results[0], results[2], results[3]]):
        np.testing.assert_array_equal(result.as_numpy("Y"), np.full((1, 2), 2 * v, np.int32))
    if model == "plain":
        # One call with the four requests; nobody's request ran twice.
        assert CALLS[model] == [[1, 1, 1, 1]]
    else:
        # One merged call (4 rows) failed on the bad row; then each request alone to find it.
        assert CALLS[model] == [[4], [1], [1], [1], [1]]


def test_a_merging_backend_gets_one_request_with_every_row(url):
    CALLS.pop("merged", None)
    results = send_together(url, "merged", [5, 6, 7, 8])
    assert CALLS["merged"] == [[4]]
    for v, result in zip([5, 6, 7, 8], results):
        np.testing.assert_array_equal(result.as_numpy("Y"), np.full((1, 2), 2 * v, np.int32))
        assert result.as_numpy("ROWS").tolist() == [[4]]  # it ran inside the merged batch


@pytest.mark.parametrize("model", ["plain", "merged"])
def test_a_call_that_raises_fails_every_request_in_it(url, model):
    results = send_together(url, model, [1, 999, 3, 4])
    assert all(isinstance(r, InferenceServerException) and r.status() == "500" for r in results)
    assert "the device fell over" in results[0].message()
    np.testing.assert_array_equal(send_together(url, model, [2])[0].as_numpy("Y"), [[4, 4]])  # still serving
