"""Issue 29, loads off the event loop: a slow `auto_complete_config` or a config.pbtxt that is a FIFO
stalled `/v2/health/live` (15 s) or hung HTTP and gRPC health; every load step now runs on a thread and
a config that is not a regular file is a load error."""
from __future__ import annotations

import os
import threading
import time

import httpx
import pytest
import tritonclient.grpc as grpcclient
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

SLOW_AUTO_COMPLETE = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        time.sleep(4)
        config.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "X", "data_type": "TYPE_INT32", "dims": [1]})
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("off_loop_repo")
    for name in ("slow_ac", "fifo"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(SLOW_AUTO_COMPLETE)
    (repo / "slow_ac" / "config.pbtxt").write_text('backend: "python"\n')
    os.mkfifo(repo / "fifo" / "config.pbtxt")
    return repo


def worst_health_latency(server: ServerProcess, during) -> float:
    """The slowest of HTTP live/ready and gRPC health answers, polled every 50 ms while `during()` runs."""
    done, worst = threading.Event(), [0.0]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)

    def poll():
        with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as http:
            while not done.is_set():
                for check in (lambda: http.get("/v2/health/live"), lambda: http.get("/v2/health/ready"),
                              grpc.is_server_live):
                    t0 = time.monotonic()
                    check()
                    worst[0] = max(worst[0], time.monotonic() - t0)
                time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        during()
    finally:
        done.set()
        poller.join(60)
    return worst[0]


def test_slow_auto_complete_and_fifo_config_leave_health_answering(repo):
    with ServerProcess([repo], "--model-control-mode", "explicit", env={"MODELPLEX_PLUGINS": "python"}) as s:
        client = grpcclient.InferenceServerClient(s.grpc_url)
        t0 = time.monotonic()
        worst = worst_health_latency(s, lambda: client.load_model("slow_ac"))
        assert time.monotonic() - t0 > 3.5 and client.is_model_ready("slow_ac")
        assert worst < 1.0, f"health took {worst:.2f} s while auto_complete_config slept 4 s"

        def load_fifo():
            with pytest.raises(InferenceServerException) as failed:
                client.load_model("fifo", client_timeout=30)
            assert "config.pbtxt is not a regular file" in failed.value.message()

        assert worst_health_latency(s, load_fifo) < 1.0
        assert client.is_server_live() and client.is_model_ready("slow_ac")
