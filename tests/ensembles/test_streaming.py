"""An ensemble whose last step is decoupled streams: every response of that step comes back as one of
the ensemble's, over gRPC's ModelStreamInfer. The decoupled model is a small plugin defined here."""
from __future__ import annotations

import asyncio
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from helpers.ensemble_models import write_ensemble
from tritonclient.utils import InferenceServerException

import modelplex
from modelplex import BackendSpec, InferResponse, InferTensor, ModelInstance
from modelplex.core.plugins import create_plugin_manager
from modelplex.core.settings import ServerConfig
from modelplex.server.assembly import Server

COUNTDOWN_CONFIG = """
name: "countdown"
backend: "countdown"
max_batch_size: 8
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "LEFT" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


class Countdown(ModelInstance):
    """For N (its first element) streams LEFT = N-1, ..., 0, each as a tensor shaped like N."""

    def __init__(self, ictx):
        pass

    async def execute(self, requests):
        raise AssertionError("a decoupled model is only streamed")

    async def stream(self, request):
        n = request.input("N").data
        for left in range(int(n.flat[0]) - 1, -1, -1):
            await asyncio.sleep(0)
            yield InferResponse("", "", [InferTensor.from_numpy("LEFT", np.full_like(n, left))])


class CountdownPlugin:
    @modelplex.hookimpl
    def modelplex_backends(self):
        return [BackendSpec(name="countdown", create_instance=Countdown, max_concurrency_per_instance=8)]


def stream(url: str, model: str, a: np.ndarray, b: np.ndarray) -> list:
    """Every response (or error) of one streamed request, in order."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    inputs = [grpcclient.InferInput("INPUT0", list(a.shape), "INT32"), grpcclient.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    client.async_stream_infer(model, inputs, enable_empty_final_response=True)
    answers = []
    while True:
        item = results.get(timeout=10)
        if isinstance(item, InferenceServerException):
            answers.append(item)
            break
        if item.get_response().parameters["triton_final_response"].bool_param and not item.get_response().outputs:
            break
        answers.append(item)
    client.stop_stream()
    return answers


def serve(repo, scenario, **settings_fields):
    async def main():
        settings = ServerConfig(model_repositories=[repo], host="127.0.0.1", grpc_port=0, allow_http=False,
                                allow_metrics=False, model_control_mode="explicit", **settings_fields)
        server = Server(settings, create_plugin_manager(allow={"onnx", "ensemble"}, extra=[CountdownPlugin()]))
        await server.start()
        try:
            return await scenario(server, f"127.0.0.1:{server.ports['grpc']}")
        finally:
            await server.stop()

    return asyncio.run(main())


@pytest.fixture
def repo(ensemble_repo, tmp_path):
    import shutil

    shutil.copytree(ensemble_repo / "simple", tmp_path / "simple")
    (tmp_path / "countdown" / "1").mkdir(parents=True)
    (tmp_path / "countdown" / "config.pbtxt").write_text(COUNTDOWN_CONFIG)
    # No model_transaction_policy here: auto-complete makes the ensemble decoupled, as its last step is.
    write_ensemble(tmp_path, "streams", [
        ("simple", {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}, {"OUTPUT0": "SUM", "OUTPUT1": "OUTPUT1"}),
        ("countdown", {"N": "SUM"}, {"LEFT": "OUTPUT0"})])
    write_ensemble(tmp_path, "streams_midway", [
        ("countdown", {"N": "INPUT0"}, {"LEFT": "LEFT"}),
        ("simple", {"INPUT0": "LEFT", "INPUT1": "INPUT1"}, {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"})])
    return tmp_path


def test_an_ensemble_ending_in_a_decoupled_step_streams_its_responses(repo):
    a, b = np.full((1, 16), 2, np.int32), np.ones((1, 16), np.int32)

    async def scenario(server, url):
        await server.dataplane.load_model("streams")
        return await asyncio.to_thread(stream, url, "streams", a, b)

    answers = serve(repo, scenario)
    assert [int(r.as_numpy("OUTPUT0")[0, 0]) for r in answers] == [2, 1, 0]  # a+b = 3 counted down
    for r in answers:
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)


def test_a_decoupled_step_that_is_not_last_fails_the_load_naming_it(repo):
    async def scenario(server, url):
        with pytest.raises(modelplex.InvalidInput) as e:
            await server.dataplane.load_model("streams_midway")
        return e.value.message

    message = serve(repo, scenario)
    assert "ensemble 'streams_midway': step 1 (model 'countdown') is decoupled, so it must be the last step" in message


def test_without_auto_complete_a_decoupled_step_needs_a_decoupled_ensemble(repo):
    """Triton makes such an ensemble decoupled itself; with --disable-auto-complete-config (strict) it must say so."""
    async def scenario(server, url):
        with pytest.raises(modelplex.InvalidInput) as e:
            await server.dataplane.load_model("streams")
        return e.value.message

    message = serve(repo, scenario, strict_model_config=True)
    assert "step 2 (model 'countdown') is decoupled, so the ensemble streams too: set model_transaction_policy" \
        in message
