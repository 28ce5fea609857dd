"""`tritonserver` flags `modelplex serve` takes (server/triton_flags.py), each on a real server: one
server runs with most of them at once; the help lists every one with its default."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

from modelplex.core.settings import ServerConfig
from modelplex.grpc.server import server_options

FLAGS = ["--disable-auto-complete-config", "--allow-client-shm", "--http-max-input-size", "--backend-directory",
         "--backend-config", "--model-load-thread-count", "--http-address", "--grpc-address", "--log-verbose",
         "--log-info", "--log-warning", "--log-error", "--log-file", "--id", "--http-header-forward-pattern",
         "--grpc-infer-response-compression-level", "--max-bytes-elements"]
OWN_PROVIDER = 'parameters { key: "execution_provider" value: { string_value: "cpu" } }\n'


def test_help_shows_every_flag_with_its_default():
    text = subprocess.run([sys.executable, "-m", "modelplex", "serve", "--help"], capture_output=True, text=True,
                          check=True).stdout
    entries = re.split(r"\n  (?=-)", text)  # one per option, as argparse lays them out
    for flag in FLAGS:
        entry = next((e for e in entries if re.search(rf"(^|, ){flag}\b", e.split("\n")[0])), None)
        assert entry is not None, f"{flag} is not in modelplex serve --help"
        assert "default" in " ".join(entry.split()), f"{flag}'s help gives no default: {entry!r}"
    assert re.search(r"default: 16777216", " ".join(text.split())), "--max-bytes-elements takes Triton's 10M elements"


@pytest.fixture(scope="module")
def flagged(example_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("flags")
    for name in ("simple", "plain", "noconfig"):
        shutil.copytree(example_repo / "simple", repo / name)
    config = (example_repo / "simple" / "config.pbtxt").read_text()
    (repo / "simple" / "config.pbtxt").write_text(config + OWN_PROVIDER)  # its own parameter beats the flag's
    (repo / "plain" / "config.pbtxt").write_text(config.replace('name: "simple"', 'name: "plain"'))
    (repo / "noconfig" / "config.pbtxt").unlink()  # only auto-complete could serve it
    log_file = tmp_path_factory.mktemp("logs") / "server.log"
    args = ["--model-control-mode", "explicit", "--load-model", "simple", "--id", "my-triton",
            "--http-address", "127.0.0.2", "--grpc-address", "127.0.0.2", "--http-max-input-size", "4096",
            "--backend-directory", "/opt/elsewhere/backends", "--backend-config", "onnxruntime,execution_provider=bogus",
            "--backend-config", "nosuch,setting=1", "--backend-config", "default-max-batch-size=4",
            "--model-load-thread-count", "1", "--disable-auto-complete-config", "--log-file", str(log_file),
            "--log-info", "false", "--grpc-infer-response-compression-level", "high"]
    with ServerProcess([repo], *args) as server:
        server.log_file = log_file
        yield server


def urls(server):
    return f"127.0.0.2:{server.ports['http']}", f"127.0.0.2:{server.ports['grpc']}"


def test_addresses_id_and_compressed_grpc_responses(flagged):
    http_url, grpc_url = urls(flagged)
    assert httpclient.InferenceServerClient(http_url).get_server_metadata()["name"] == "my-triton"
    with pytest.raises(httpx.ConnectError):  # --http-address: not on --host's 127.0.0.1
        httpx.get(f"http://127.0.0.1:{flagged.ports['http']}/v2/health/live")
    client = grpcclient.InferenceServerClient(grpc_url)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
    assert client.infer("simple", inputs).as_numpy("OUTPUT0").sum() == 32
    assert ("grpc.default_compression_level", 3) in server_options(ServerConfig(grpc_compression_level="high"))
    assert not any(k == "grpc.default_compression_level" for k, _ in server_options(ServerConfig()))


def test_http_max_input_size_bounds_the_body(flagged):
    http_url, _ = urls(flagged)
    answer = httpx.post(f"http://{http_url}/v2/models/simple/infer", content=b"x" * 5000)
    assert answer.status_code == 400 and "exceeds the server's limit of 4096 bytes" in answer.json()["error"]


def test_backend_config_gives_that_backends_models_a_default_parameter(flagged):
    client = httpclient.InferenceServerClient(urls(flagged)[0])
    assert client.is_model_ready("simple")  # its own execution_provider wins
    with pytest.raises(InferenceServerException, match="parameter 'execution_provider' must be one of .* 'bogus'"):
        client.load_model("plain")


def test_disable_auto_complete_config_needs_a_complete_config(flagged):
    with pytest.raises(InferenceServerException, match="failed to load 'noconfig'"):
        httpclient.InferenceServerClient(urls(flagged)[0]).load_model("noconfig")


def test_log_file_and_levels(flagged):
    client = httpclient.InferenceServerClient(urls(flagged)[0])
    settings = client.get_log_settings()
    assert settings["log_file"] == str(flagged.log_file) and settings["log_info"] is False
    text = flagged.log_file.read_text()
    assert "--backend-directory /opt/elsewhere/backends is ignored" in text  # warned about, once
    assert text.count("--backend-directory") == 1
    assert "names backend 'nosuch', which is not installed" in text and "'default-max-batch-size=4' names no backend" in text
    assert " INFO " not in text  # --log-info false
    assert "modelplex ready" not in flagged.log()


@pytest.mark.parametrize("args, words", [
    (["--model-load-thread-count", "0"], "--model-load-thread-count must be at least 1"),
    (["--backend-config", "onnx,novalue"], "--backend-config expects <backend>,<setting>=<value>"),
    (["--http-header-forward-pattern", "("], "--http-header-forward-pattern is not a valid regular expression"),
    (["--http-restricted-api", "statistics:k=v", "--http-restricted-api", "statistics,logging:k2=v2"],
     "restricted api 'statistics' can not be specified in multiple config groups"),
    (["--grpc-restricted-protocol", "health,health:k=v"], "restricted api 'health' can not be specified"),
])
def test_bad_flag_values_stop_the_start_naming_them(example_repo, args, words):
    with pytest.raises(RuntimeError, match=re.escape(words)):
        ServerProcess([example_repo], *args, timeout=30).start()
