"""The separate admin address, and the host without the access plugin: `modelplex_admin` is an
ordinary plugin, so a server whose allow-list leaves it out serves (open, plain text) and does not
know its flags."""
from __future__ import annotations

import os
import subprocess
import sys

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

ADMIN = "admin-split-token"


def simple_inputs(module):
    tensors = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    for t in tensors:
        t.set_data_from_numpy(np.ones((1, 16), np.int32))
    return tensors


@pytest.fixture(scope="module")
def split(example_repo):
    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "*",
                       "--admin-http-port", "0", "--admin-grpc-port", "0", "--admin-token", ADMIN) as s:
        yield s


def test_http_model_control_only_on_the_admin_port(split):
    main, admin = f"http://{split.http_url}", f"http://127.0.0.1:{split.ports['admin_http']}"
    auth = {"authorization": f"Bearer {ADMIN}"}
    refused = httpx.post(f"{main}/v2/repository/index", headers=auth)
    assert refused.status_code == 404 and "admin port" in refused.json()["error"]
    assert httpx.get(f"{main}/v2/logging", headers=auth).status_code == 404
    # On the admin port the token still applies.
    assert httpx.post(f"{admin}/v2/repository/index").status_code == 401
    assert {row["name"] for row in httpx.post(f"{admin}/v2/repository/index", headers=auth).json()} >= {"simple"}
    client = httpclient.InferenceServerClient(f"127.0.0.1:{split.ports['admin_http']}")
    client.unload_model("simple_string", headers=dict(auth))
    client.load_model("simple_string", headers=dict(auth))
    # The admin port answers health (probes) and nothing else; the main port serves inference.
    assert client.is_server_live()
    with pytest.raises(InferenceServerException) as elsewhere:
        client.infer("simple", simple_inputs(httpclient))
    assert elsewhere.value.status() == "404"
    answer = httpclient.InferenceServerClient(split.http_url).infer("simple", simple_inputs(httpclient))
    assert answer.as_numpy("OUTPUT0").sum() == 32


def test_grpc_model_control_only_on_the_admin_port(split):
    main = grpcclient.InferenceServerClient(split.grpc_url)
    admin = grpcclient.InferenceServerClient(f"127.0.0.1:{split.ports['admin_grpc']}")
    auth = {"authorization": f"Bearer {ADMIN}"}
    with pytest.raises(InferenceServerException) as refused:
        main.get_model_repository_index(headers=auth)
    assert refused.value.status() == "StatusCode.UNIMPLEMENTED" and "admin port" in refused.value.message()
    assert {m.name for m in admin.get_model_repository_index(headers=auth).models} >= {"simple"}
    assert admin.is_server_ready()
    with pytest.raises(InferenceServerException) as elsewhere:
        admin.infer("simple", simple_inputs(grpcclient))
    assert elsewhere.value.status() == "StatusCode.UNIMPLEMENTED"
    assert main.infer("simple", simple_inputs(grpcclient)).as_numpy("OUTPUT1").sum() == 0


def test_the_host_serves_without_the_access_plugin(example_repo):
    without = {"MODELPLEX_PLUGINS": "onnx"}
    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "simple",
                       env=without) as s:
        client = httpclient.InferenceServerClient(s.http_url)
        assert client.infer("simple", simple_inputs(httpclient)).as_numpy("OUTPUT0").sum() == 32
        assert httpx.post(f"http://{s.http_url}/v2/repository/index").status_code == 200  # nobody guards it
    usage = subprocess.run([sys.executable, "-m", "modelplex", "serve", "--model-repository", str(example_repo),
                            "--admin-token", "t"], env={**os.environ, **without},
                           capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "--admin-token" in usage.stderr
