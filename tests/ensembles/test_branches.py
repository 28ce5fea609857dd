"""Independent branches of an ensemble run at the same time: two slow steps that do not depend on
each other take the time of one. The slow model is a small plugin backend defined here."""
from __future__ import annotations

import asyncio
import time

import numpy as np

import modelplex
from modelplex import BackendSpec, InferRequest, InferResponse, InferTensor, ModelInstance
from modelplex.core.plugins import create_plugin_manager
from modelplex.core.settings import ServerConfig
from modelplex.server.assembly import Server

STEP_SECONDS = 0.3
SLOW_CONFIG = """
name: "slow_copy"
backend: "slow_copy"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 4 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
ENSEMBLE_CONFIG = """
name: "two_branches"
platform: "ensemble"
max_batch_size: 0
input [ { name: "A" data_type: TYPE_INT32 dims: [ 4 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "A_COPY" data_type: TYPE_INT32 dims: [ 4 ] }, { name: "B_COPY" data_type: TYPE_INT32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "slow_copy" model_version: -1 input_map { key: "X" value: "A" } output_map { key: "Y" value: "A_COPY" } },
  { model_name: "slow_copy" model_version: -1 input_map { key: "X" value: "B" } output_map { key: "Y" value: "B_COPY" } }
] }
"""


class SlowCopy(ModelInstance):
    def __init__(self, ictx):
        pass

    async def execute(self, requests):
        await asyncio.sleep(STEP_SECONDS)
        return [InferResponse("", "", [InferTensor("Y", "INT32", list(r.inputs[0].shape), r.inputs[0].data)])
                for r in requests]


class SlowCopyPlugin:
    @modelplex.hookimpl
    def modelplex_backends(self):
        return [BackendSpec(name="slow_copy", create_instance=SlowCopy)]


def test_independent_steps_run_concurrently(tmp_path):
    for name, config in (("slow_copy", SLOW_CONFIG), ("two_branches", ENSEMBLE_CONFIG)):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(config)
    a, b = np.arange(4, dtype=np.int32), np.arange(4, 8, dtype=np.int32)

    async def main():
        settings = ServerConfig(model_repositories=[tmp_path], host="127.0.0.1", allow_http=False, allow_grpc=False,
                                allow_metrics=False)
        server = Server(settings, create_plugin_manager(allow={"ensemble"}, extra=[SlowCopyPlugin()]))
        await server.start()
        try:
            request = InferRequest("two_branches", [InferTensor.from_numpy("A", a), InferTensor.from_numpy("B", b)])
            start = time.monotonic()
            response = await server.dataplane.infer(request)
            return time.monotonic() - start, {t.name: t.data for t in response.outputs}
        finally:
            await server.stop()

    elapsed, outputs = asyncio.run(main())
    np.testing.assert_array_equal(outputs["A_COPY"], a)
    np.testing.assert_array_equal(outputs["B_COPY"], b)
    assert elapsed < 1.6 * STEP_SECONDS, f"two independent {STEP_SECONDS}s steps took {elapsed:.2f}s"
