"""The model repository extension over HTTP with tritonclient: index, load / unload / reload, a config
override, a files override, and model names that must never reach outside the repository."""
from __future__ import annotations

import json
import shutil

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

BAD_NAMES = ["..", "a/b", "/etc", "bad\x00name", "x" * 300, "../outside"]


@pytest.fixture(scope="module")
def repo(example_repo, tmp_path_factory):
    root = tmp_path_factory.mktemp("http-repo")
    shutil.copytree(example_repo, root / "repo")
    (root / "canary.txt").write_text("untouched")
    return root / "repo"


@pytest.fixture(scope="module")
def server(repo):
    with ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", "*") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with httpclient.InferenceServerClient(server.http_url) as c:
        yield c


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=60) as c:
        yield c


def infer_int32(client, batch: int = 1):
    a = np.arange(batch * 16, dtype=np.int32).reshape(batch, 16)
    inputs = [httpclient.InferInput(n, [batch, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def states(client, name):
    return [(m.get("version"), m.get("state")) for m in client.get_model_repository_index() if m["name"] == name]


def test_unload_then_load_again(client, http):
    client.unload_model("simple", unload_dependents=True)
    assert not client.is_model_ready("simple")
    assert states(client, "simple") == [("1", "UNAVAILABLE")]
    assert [m["name"] for m in client.get_model_repository_index() if m.get("state") == "READY"] == ["simple_string"]
    refused = http.post("/v2/models/simple/infer", json={"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [0] * 16},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [0] * 16}]})
    assert refused.status_code in (404, 503) and "simple" in refused.json()["error"]
    client.load_model("simple")
    assert client.is_model_ready("simple") and states(client, "simple") == [("1", "READY")]
    infer_int32(client)


def test_config_override_then_reload_from_the_repository(client):
    client.load_model("simple", config='{"max_batch_size":"16"}')  # as JSON text, the way Triton takes it
    assert client.get_model_config("simple")["max_batch_size"] == 16
    infer_int32(client, batch=12)
    client.load_model("simple")
    assert client.get_model_config("simple")["max_batch_size"] == 8
    with pytest.raises(InferenceServerException, match="exceeds the model's max_batch_size 8"):
        infer_int32(client, batch=12)


def test_files_override_serves_the_uploaded_model(client, repo):
    config = client.get_model_config("simple_string")
    config["name"] = "simple"
    onnx_bytes = (repo / "simple_string" / "1" / "model.onnx").read_bytes()
    client.load_model("simple", config=json.dumps(config), files={"file:1/model.onnx": onnx_bytes})
    assert client.get_model_metadata("simple")["inputs"][0]["datatype"] == "BYTES"
    inputs = [httpclient.InferInput(n, [1, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.full((1, 16), b"20", dtype=np.object_))
    assert client.infer("simple", inputs).as_numpy("OUTPUT0").ravel().tolist() == [b"40"] * 16
    # A failed upload replaces nothing: the model uploaded before keeps serving.
    with pytest.raises(InferenceServerException):
        client.load_model("simple", config=json.dumps(config), files={"file:1/model.onnx": b"not onnx"})
    assert client.infer("simple", inputs).as_numpy("OUTPUT0").ravel().tolist() == [b"40"] * 16
    client.unload_model("simple")
    client.load_model("simple", config=json.dumps(config), files={"file:1/model.onnx": onnx_bytes})
    client.load_model("simple")  # without files: back to the repository's model
    assert client.get_model_metadata("simple")["inputs"][0]["datatype"] == "INT32"
    infer_int32(client)


def test_load_failures_are_clear_and_change_nothing(client, http):
    with pytest.raises(InferenceServerException, match="invalid model config JSON") as e:
        client.load_model("simple", config="{not json")
    assert e.value.status() == "400"
    with pytest.raises(InferenceServerException, match="model 'ghost' is not in the model repository"):
        client.load_model("ghost")
    response = http.post("/v2/repository/models/simple/load", json={"parameters": {"colour": "red"}})
    assert (response.status_code, response.json()) == (
        400, {"error": "unknown load parameter 'colour' (expected 'config' or 'file:<path>')"})
    response = http.post("/v2/repository/models/simple/load", json={"parameters": {"config": {"max_batch_size": 4}}})
    assert response.status_code == 400 and "'config' must be a string" in response.json()["error"]
    assert client.get_model_config("simple")["max_batch_size"] == 8
    infer_int32(client)


def snapshot(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_mtime_ns) for p in folder.rglob("*"))


@pytest.mark.parametrize("name", BAD_NAMES, ids=["dotdot", "slash", "absolute", "nul", "300 bytes", "dotdot-slash"])
def test_bad_model_names_are_refused_and_touch_nothing(client, http, repo, name):
    before = snapshot(repo.parent)
    for call in (lambda: client.load_model(name), lambda: client.unload_model(name),
                 lambda: client.load_model(name, config="{}", files={"file:1/model.onnx": b"x"})):
        with pytest.raises(InferenceServerException) as e:
            call()
        assert e.value.status() == "400", e.value.message()
        assert "invalid model name" in e.value.message()
    encoded = "".join(f"%{b:02X}" for b in name.encode())  # every byte, so no client drops a '..' segment
    for action in ("load", "unload"):
        response = http.post(f"/v2/repository/models/{encoded}/{action}")
        assert response.status_code == 400 and "invalid model name" in response.json()["error"]
    assert snapshot(repo.parent) == before
    assert (repo.parent / "canary.txt").read_text() == "untouched"
    infer_int32(client)


def test_file_paths_outside_the_model_folder_are_refused(client, repo):
    before = snapshot(repo.parent)
    config = json.dumps(client.get_model_config("simple"))
    for path in ("../../canary.txt", "/tmp/evil.onnx"):
        with pytest.raises(InferenceServerException) as e:
            client.load_model("simple", config=config, files={f"file:{path}": b"overwritten"})
        assert e.value.status() == "400" and path in e.value.message()
    assert snapshot(repo.parent) == before and (repo.parent / "canary.txt").read_text() == "untouched"
    infer_int32(client)
