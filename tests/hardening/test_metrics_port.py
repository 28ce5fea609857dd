"""Issue 29, the metrics port and LLM load: the port served each connection on a thread with no timeout
(500 idle connections made 500 threads); `nv_inference_pending_request_count` missed the requests
waiting inside LLM engines, which is what an autoscaler on it must see."""
from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import httpx
from helpers.serverproc import ServerProcess

from modelplex.core.backend import BackendSpec, EngineStats, ModelInstance
from modelplex.core.settings import ServerConfig
from modelplex.dataplane import DataPlane
from modelplex.observability.metrics import triton_metrics_text


def threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def test_idle_connections_take_no_thread_and_cannot_lock_a_scraper_out(example_repo):
    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "simple",
                       env={"MODELPLEX_PLUGINS": "onnx"}) as s:
        pid, port = s.proc.pid, s.ports["metrics"]
        before = threads(pid)
        idle = []
        try:
            for _ in range(500):
                idle.append(socket.create_connection(("127.0.0.1", port)))
            time.sleep(0.5)
            assert threads(pid) <= before + 2, f"{threads(pid) - before} threads more for 500 idle connections"
            t0 = time.monotonic()
            r = httpx.get(s.metrics_url, timeout=10)  # evicts the longest-idle connection if need be
            assert r.status_code == 200 and "nv_inference_pending_request_count" in r.text
            assert time.monotonic() - t0 < 5
        finally:
            for sock in idle:
                sock.close()
        assert httpx.get(s.metrics_url, timeout=10).status_code == 200


class Engine(ModelInstance):
    async def execute(self, requests):
        return []

    def engine_stats(self):
        return EngineStats(num_running=2, num_waiting=3)


def test_pending_requests_include_those_waiting_in_llm_engines(tmp_path):
    (tmp_path / "llm" / "1").mkdir(parents=True)
    (tmp_path / "llm" / "config.pbtxt").write_text(
        'backend: "engine"\ninstance_group [ { count: 2 } ]\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\noutput [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    dataplane = DataPlane(ServerConfig(model_repositories=[tmp_path]),
                          {"engine": BackendSpec(name="engine", create_instance=lambda ictx: Engine())})

    async def run():
        await dataplane.manager.start()
        try:
            assert dataplane.engine_waiting() == {("llm", "1"): 6}  # 3 in each of the 2 engines
            text = triton_metrics_text(dataplane.manager.loaded_stats(), dataplane.engine_waiting())
            assert 'nv_inference_pending_request_count{model="llm",version="1"} 6.0' in text
        finally:
            await dataplane.manager.stop()

    asyncio.run(run())
