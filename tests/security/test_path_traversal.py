"""Names and paths that try to leave the model repository, through every endpoint that takes one:
refused with 400 / INVALID_ARGUMENT (lookups: a 4xx), and a canary file outside the repository untouched."""
from __future__ import annotations

import base64
import json
from urllib.parse import quote

import httpx
import pytest
import tritonclient.grpc as grpcclient
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

CANARY_TEXT = "canary: must never change"
# Each is tried as a model name (percent-encoded in URLs, so the server sees the raw characters).
NAMES = ["..", "../canary.txt", "../../canary.txt", "simple/../../canary.txt", "/etc/passwd", "..\\canary.txt",
         "simple\x00", ".hidden"]
# Each is tried as a `file:<path>` load parameter of a valid model name.
FILE_PATHS = ["../canary.txt", "../../canary.txt", "1/../../../canary.txt", "/tmp/evil.txt", "1/\x00x"]


@pytest.fixture(scope="module")
def setup(example_repo, tmp_path_factory):
    import shutil

    root = tmp_path_factory.mktemp("traversal")
    repo = root / "repo"
    shutil.copytree(example_repo, repo)
    canary = root / "canary.txt"
    canary.write_text(CANARY_TEXT)
    with ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", "simple") as s:
        yield s, root, canary


def snapshot(root):
    """Every file outside the repository, with its size and mtime: nothing may appear or change."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file() and "repo" not in p.relative_to(root).parts}


def files_param(path: str) -> dict:
    config = json.dumps({"name": "simple", "backend": "onnxruntime"})
    return {"parameters": {"config": config, f"file:{path}": base64.b64encode(b"pwned").decode()}}


def test_http_names_and_paths_are_refused(setup):
    server, root, canary = setup
    before = snapshot(root)
    base = f"http://{server.http_url}"
    for name in NAMES:
        enc = quote(name, safe="").replace(".", "%2E")  # or the client would resolve `..` itself
        for action in ("load", "unload"):
            r = httpx.post(f"{base}/v2/repository/models/{enc}/{action}")
            assert r.status_code == 400, (name, action, r.text)
            assert CANARY_TEXT not in r.text and str(root) not in r.text  # no contents, no resolved paths
        for suffix in ("", "/config", "/ready", "/stats", "/versions/1"):
            r = httpx.get(f"{base}/v2/models/{enc}{suffix}")
            assert r.status_code in (400, 404), (name, suffix, r.status_code)
            assert CANARY_TEXT not in r.text and str(root) not in r.text
    for path in FILE_PATHS:
        r = httpx.post(f"{base}/v2/repository/models/simple/load", json=files_param(path))
        assert r.status_code == 400 and str(root) not in r.text, (path, r.text)
    assert snapshot(root) == before and canary.read_text() == CANARY_TEXT
    assert httpx.get(f"{base}/v2/models/simple/ready").status_code == 200  # the real model is untouched


def test_grpc_names_and_paths_are_refused(setup):
    server, root, canary = setup
    before = snapshot(root)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for name in NAMES:
        for call in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException) as refused:
                call(name)
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT", (name, call.__name__)
        with pytest.raises(InferenceServerException) as refused:
            client.get_model_metadata(name)
        assert refused.value.status() in ("StatusCode.INVALID_ARGUMENT", "StatusCode.NOT_FOUND")
    config = json.dumps({"name": "simple", "backend": "onnxruntime"})
    for path in FILE_PATHS:
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("simple", config=config, files={f"file:{path}": b"pwned"})
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT", path
    assert snapshot(root) == before and canary.read_text() == CANARY_TEXT
    assert client.is_model_ready("simple")
