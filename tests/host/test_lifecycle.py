"""Model lifecycle through the real server: version policies, load/reload/unload, poll mode, failures."""
from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException


def simple_inputs():
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a + b


def set_policy(model_dir, policy: str) -> None:
    config = model_dir / "config.pbtxt"
    config.write_text(config.read_text() + f"\nversion_policy: {policy}\n")


def add_versions(model_dir, *versions: int) -> None:
    for v in versions:
        shutil.copytree(model_dir / "1", model_dir / str(v))


def ready_versions(client, name) -> list[str]:
    return [row["version"] for row in client.get_model_repository_index()
            if row["name"] == name and row.get("state") == "READY"]


@pytest.mark.parametrize("policy, expected", [
    ("{ latest { num_versions: 2 } }", ["2", "3"]),
    ("{ all { } }", ["1", "2", "3"]),
    ("{ specific { versions: [1, 3] } }", ["1", "3"]),
    ("", ["3"]),
])
def test_version_policy(repo_copy, policy, expected):
    add_versions(repo_copy / "simple", 2, 3)
    if policy:
        set_policy(repo_copy / "simple", policy)
    with ServerProcess([repo_copy]) as s:
        client = httpclient.InferenceServerClient(s.http_url)
        assert ready_versions(client, "simple") == expected
        for v in ("1", "2", "3"):
            assert client.is_model_ready("simple", v) == (v in expected)
        inputs, total = simple_inputs()
        result = client.infer("simple", inputs, model_version=expected[0])
        assert result.get_response()["model_version"] == expected[0]
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), total)
        # no version given: the highest ready one answers
        assert client.infer("simple", inputs).get_response()["model_version"] == expected[-1]


def test_failed_model_does_not_affect_others(repo_copy):
    broken = repo_copy / "broken"
    broken.mkdir()
    (broken / "config.pbtxt").write_text('name: "broken"\nbackend: "onnxruntime"\nmax_batch_size: 8\n')
    (broken / "1").mkdir()
    (broken / "1" / "model.onnx").write_bytes(b"this is not an onnx model")
    with ServerProcess([repo_copy], "--strict-readiness", "false", "--exit-on-error=false") as s:
        client = httpclient.InferenceServerClient(s.http_url)
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert rows["broken"]["state"] == "UNAVAILABLE" and rows["broken"]["reason"]
        assert client.is_model_ready("simple") and not client.is_model_ready("broken")
        inputs, total = simple_inputs()
        np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), total)


def test_strict_readiness_reports_failed_model(repo_copy):
    (repo_copy / "broken").mkdir()
    (repo_copy / "broken" / "config.pbtxt").write_text("this is not pbtxt {")
    with ServerProcess([repo_copy], "--exit-on-error=false") as s:
        client = httpclient.InferenceServerClient(s.http_url)
        assert client.is_server_live() and not client.is_server_ready()
        assert client.is_model_ready("simple")


class Traffic:
    """Sends `simple` requests in a loop from a thread, counting successes and failures."""

    def __init__(self, url: str):
        self.client = httpclient.InferenceServerClient(url)
        self.ok = 0
        self.errors: list[str] = []
        self.versions: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        inputs, total = simple_inputs()
        while not self._stop.is_set():
            try:
                result = self.client.infer("simple", inputs)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), total)
                self.versions.add(result.get_response()["model_version"])
                self.ok += 1
            except Exception as e:
                self.errors.append(repr(e))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_poll_mode_picks_up_new_version_without_failures(repo_copy):
    with ServerProcess([repo_copy], "--model-control-mode", "poll", "--repository-poll-secs", "0.5") as s:
        client = httpclient.InferenceServerClient(s.http_url)
        with Traffic(s.http_url) as traffic:
            time.sleep(0.5)
            add_versions(repo_copy / "simple", 2)
            assert wait_for(lambda: ready_versions(client, "simple") == ["2"])
            assert wait_for(lambda: "2" in traffic.versions)
            time.sleep(0.5)
        assert traffic.errors == [] and traffic.ok > 10
        assert traffic.versions == {"1", "2"}
        # poll mode refuses explicit control, as Triton does
        with pytest.raises(InferenceServerException, match="poll"):
            client.unload_model("simple")


def test_poll_mode_keeps_old_version_when_config_breaks(repo_copy):
    with ServerProcess([repo_copy], "--model-control-mode", "poll", "--repository-poll-secs", "0.3",
                       "--strict-readiness", "false") as s:
        client = httpclient.InferenceServerClient(s.http_url)
        (repo_copy / "simple" / "config.pbtxt").write_text('name: "simple"\nmax_batch_size: [oops')
        assert wait_for(lambda: any(r.get("reason") for r in client.get_model_repository_index()
                                    if r["name"] == "simple"))
        inputs, total = simple_inputs()
        np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), total)


def test_explicit_load_unload_reload_under_traffic(repo_copy):
    with ServerProcess([repo_copy], "--model-control-mode", "explicit", "--load-model", "simple") as s:
        client = httpclient.InferenceServerClient(s.http_url)
        assert client.is_model_ready("simple") and not client.is_model_ready("simple_string")
        client.load_model("simple_string")
        assert client.is_model_ready("simple_string")
        with Traffic(s.http_url) as traffic:
            for _ in range(3):
                client.load_model("simple", config='{"max_batch_size":"16"}')
                assert client.get_model_config("simple")["max_batch_size"] == 16
                client.load_model("simple")
                assert client.get_model_config("simple")["max_batch_size"] == 8
        assert traffic.errors == [] and traffic.ok > 0
        client.unload_model("simple_string")
        assert not client.is_model_ready("simple_string")
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert rows["simple_string"]["state"] == "UNAVAILABLE" and rows["simple_string"]["reason"] == "unloaded"
        with pytest.raises(InferenceServerException):
            client.infer("simple_string", [])


def test_loading_an_unknown_model_leaves_nothing_behind(repo_copy):
    with ServerProcess([repo_copy], "--model-control-mode", "explicit") as s:
        client = httpclient.InferenceServerClient(s.http_url)
        with pytest.raises(InferenceServerException, match="not in the model repository"):
            client.load_model("nope")
        assert "nope" not in {r["name"] for r in client.get_model_repository_index()}
        with pytest.raises(InferenceServerException, match="not found"):
            client.unload_model("nope")
