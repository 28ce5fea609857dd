"""`--model-load-timeout-secs`: a model whose load hangs fails with that reason, and the server
keeps serving the others (and can still load more) meanwhile."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

CONFIG = """name: "{name}"
backend: "python"
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
parameters {{ key: "initialize_timeout_secs" value {{ string_value: "20" }} }}
"""
MODEL = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep({sleep})

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("load_timeout_repo")
    for name, sleep in (("hangs", 3600), ("echo", 0)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (repo / name / "1" / "model.py").write_text(MODEL.format(sleep=sleep))
    return repo


def echo(client) -> int:
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([7], np.int32))
    return int(client.infer("echo", [x]).as_numpy("X")[0])


def test_a_hanging_load_times_out_with_a_reason_and_the_server_keeps_serving(repo):
    with ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", "echo",
                       "--model-load-timeout-secs", "2", env={"MODELPLEX_PLUGINS": "python"}) as s:
        client = httpclient.InferenceServerClient(s.http_url, network_timeout=60)
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("hangs")
        assert 1.5 < time.monotonic() - t0 < 10
        assert "did not finish loading within 2 s" in failed.value.message()
        row = next(r for r in client.get_model_repository_index() if r["name"] == "hangs")
        assert row["state"] == "UNAVAILABLE" and "within 2 s" in row["reason"]
        assert not client.is_model_ready("hangs") and client.is_server_live()
        assert echo(client) == 7
        # The load that timed out was cancelled: its worker, still in the hung initialize, is killed
        # (it used to run on unobserved until the server exited).
        deadline = time.monotonic() + 10
        while len([pid for pid in _children(s.proc.pid) if _alive(pid)]) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len([pid for pid in _children(s.proc.pid) if _alive(pid)]) == 1  # echo's only
        client.unload_model("echo")
        client.load_model("echo")  # loading still works after the hung one was given up
        assert echo(client) == 7
        workers = _children(s.proc.pid)
    # Every worker goes with the server.
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if _alive(pid)]


def _children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
