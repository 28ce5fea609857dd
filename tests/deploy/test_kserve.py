"""deploy/kserve: the ClusterServingRuntimes' containers are valid pod containers whose flags the real CLI
accepts, and the Hugging Face runtime's start script, run here with /mnt/models pointing at a real GGUF,
serves that model under the InferenceService's name."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import kubernetes_validate
import pytest
import yaml

from modelplex.server.cli import build_parser

KSERVE = Path(__file__).resolve().parents[2] / "deploy" / "kserve"
RUNTIMES = {d["metadata"]["name"]: d for d in yaml.safe_load_all((KSERVE / "clusterservingruntimes.yaml").read_text())}
KUBERNETES_VERSION = "1.30.0"
KSERVE_HTTP_PORT, KSERVE_GRPC_PORT = 8080, 9000  # where KServe sends v2 HTTP and gRPC traffic
SMALL_ENGINE = "\n".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in (
    ("dtype", "float32"), ("max_model_len", "512"), ("kv_cache_memory_bytes", "33554432")))


def container(runtime: str) -> dict:
    [c] = RUNTIMES[runtime]["spec"]["containers"]
    return c


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_runtime_container_is_a_valid_pod_container(runtime):
    """ClusterServingRuntime is a CRD (no schema here); its containers are core Containers: checked as a Pod's."""
    spec = RUNTIMES[runtime]["spec"]
    assert RUNTIMES[runtime]["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    assert all(f["autoSelect"] is False for f in spec["supportedModelFormats"])  # never takes Triton's models
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": spec["containers"]}}
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    assert container(runtime)["name"] == "kserve-container"  # the name KServe merges the predictor into
    assert container(runtime)["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": KSERVE_HTTP_PORT}


def test_repository_runtime_flags():
    args = build_parser().parse_args(["serve", *container("modelplex")["args"]])
    assert [str(p) for p in args.model_repository] == ["/mnt/models"]  # where KServe puts storageUri
    assert (args.http_port, args.grpc_port) == (KSERVE_HTTP_PORT, KSERVE_GRPC_PORT)
    assert args.metrics_port == int(RUNTIMES["modelplex"]["spec"]["annotations"]["prometheus.kserve.io/port"])
    assert args.strict_readiness is True
    formats = {f["name"] for f in RUNTIMES["modelplex"]["spec"]["supportedModelFormats"]}
    assert formats == {"triton", "onnx", "openvino"}


@pytest.mark.slow
def test_huggingface_runtime_script_serves_the_mounted_model(gguf_path, tmp_path):
    """The script as KServe runs it (`sh -ec`), with /mnt/models, /tmp and the ports moved to this machine's."""
    c = container("modelplex-huggingface")
    assert c["command"] == ["sh", "-ec"]
    mnt = tmp_path / "mnt-models"
    mnt.mkdir()
    (mnt / "model.gguf").symlink_to(gguf_path)  # what the storage initializer leaves for a GGUF storageUri
    script = c["args"][0].replace("{{.Name}}", "smollm2")  # KServe fills in the InferenceService's name
    script = script.replace("/tmp/", f"{tmp_path}/").replace("/mnt/models", str(mnt))
    # This machine's free ports, reported in a file once the startup load is done (the last line is the exec).
    script = re.sub(r"(--(?:http|grpc|metrics)-port=)\d+", r"\g<1>0", script)
    ports = tmp_path / "ports.json"
    script = script.rstrip() + f" --host=127.0.0.1 --port-file={ports}\n"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HF_HUB_OFFLINE": "1",
           # The predictor's env tunes the engine: small enough here to skip sizing the KV cache by profiling.
           "MODELPLEX_MODEL_CONFIG": SMALL_ENGINE}
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen([*c["command"], script], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300  # loading the LLM on a busy 2-core machine
        while not ports.exists():
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.2)
        http = json.loads(ports.read_text())["http"]
        assert httpx.get(f"http://127.0.0.1:{http}/v2/health/ready").status_code == 200
        answer = httpx.post(f"http://127.0.0.1:{http}/v1/completions", timeout=60,
                            json={"model": "smollm2", "prompt": "Hello", "max_tokens": 2, "temperature": 0})
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 2
    finally:
        server.terminate()
        returncode = server.wait(60)
        log.close()
    assert returncode == 0, (tmp_path / "server.log").read_text()  # exec: the server itself got SIGTERM
