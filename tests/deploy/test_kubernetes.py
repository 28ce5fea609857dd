"""deploy/kubernetes: schema-valid manifests whose probes, ports, flags and shutdown budget match the
real server (container args parsed by the real CLI, probes sent to a real server started with them)."""
from __future__ import annotations

import base64
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import kubernetes_validate
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.serverproc import ServerProcess

from modelplex.server.assembly import FLUSH_GRACE_SECS, UNLOAD_GRACE_SECS
from modelplex.server.cli import build_parser

K8S = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"  # the oldest release these manifests target (gRPC probes are GA since 1.27)


def load(name: str) -> dict:
    return yaml.safe_load((K8S / name).read_text())


def container(deployment: dict) -> dict:
    [c] = deployment["spec"]["template"]["spec"]["containers"]
    return c


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of container args."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], a) for a in args]


def serve_args(deployment: dict) -> list[str]:
    """The container's args as `modelplex serve` receives them (the image's entrypoint is `modelplex serve`)."""
    return expand(container(deployment)["args"], load("configmap.yaml")["data"])


# Custom resources: kubernetes-validate knows only the built-in kinds; these are checked by their own tests.
CUSTOM_KINDS = {"ServiceMonitor"}


@pytest.mark.parametrize("name", sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"))
def test_manifest_is_schema_valid(name):
    for doc in yaml.safe_load_all((K8S / name).read_text()):
        if doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def kustomize(folder: Path) -> subprocess.CompletedProcess:
    kubectl = shutil.which("kubectl")
    if kubectl is None:  # the machine image ships it (google-cloud-cli); CI must not pass by skipping
        (pytest.fail if os.environ.get("CI") else pytest.skip)("kubectl (with its built-in kustomize) is not installed")
    return subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120)


def test_kustomize_renders_every_object_a_fresh_cluster_needs(tmp_path):
    """`kubectl apply -k` on an empty namespace: the Secret and the claim the pods mount are made by the
    kustomization itself, so no pod waits for an object nobody creates; every object is schema-valid."""
    folder = tmp_path / "kubernetes"
    shutil.copytree(K8S, folder)
    (folder / "admin-token").write_text("0123456789abcdef\n")
    rendered = kustomize(folder)
    assert rendered.returncode == 0, rendered.stderr
    docs = list(yaml.safe_load_all(rendered.stdout))
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    made = {(d["kind"], d["metadata"]["name"]) for d in docs}
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    for volume in pod["volumes"]:
        if "secret" in volume:
            assert ("Secret", volume["secret"]["secretName"]) in made, volume
            assert not volume["secret"].get("optional"), "the server exits when --admin-token-file is missing"
        if "persistentVolumeClaim" in volume:
            assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in made, volume
    assert ("ServiceAccount", pod["serviceAccountName"]) in made
    [secret] = [d for d in docs if d["kind"] == "Secret"]
    assert base64.b64decode(secret["data"]["token"]).decode().strip() == "0123456789abcdef"


def test_kustomize_without_the_admin_token_stops_at_once_naming_it(tmp_path):
    folder = tmp_path / "kubernetes"
    shutil.copytree(K8S, folder)
    (folder / "admin-token").unlink(missing_ok=True)
    rendered = kustomize(folder)
    assert rendered.returncode != 0 and "admin-token" in rendered.stderr, rendered.stderr


def test_defaults_keep_healthy_models_serving():
    """A broken model in the shared repository must not take every replica out of the Service: readiness
    ignores individual models, and one slow probe answer does not count as NotReady."""
    assert load("configmap.yaml")["data"]["STRICT_READINESS"] == "false"
    for name in ("deployment.yaml", "deployment-grpc-probes.yaml"):
        probe = container(load(name))["readinessProbe"]
        assert probe["periodSeconds"] == 5 and probe["failureThreshold"] == 3, (name, probe)
        assert probe.get("timeoutSeconds", 1) >= 2, (name, probe)


def test_pods_get_no_kubernetes_api_token():
    assert load("serviceaccount.yaml")["automountServiceAccountToken"] is False
    for name in ("deployment.yaml", "deployment-grpc-probes.yaml"):
        pod = load(name)["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["serviceAccountName"] == load("serviceaccount.yaml")["metadata"]["name"]


def test_network_policy_and_service_monitor_select_the_pods_and_ports():
    labels = load("deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for p in load("service.yaml")["spec"]["ports"]}
    policy = load("networkpolicy.yaml")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert {p["port"] for rule in policy["ingress"] for p in rule["ports"]} == port_names
    monitor = load("servicemonitor.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= load("service.yaml")["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]


def test_the_validator_catches_a_misspelled_field():
    broken = load("deployment.yaml")
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_existing_files():
    for resource in load("kustomization.yaml")["resources"]:
        assert (K8S / resource).is_file(), resource


def test_container_args_are_valid_server_flags():
    deployment = load("deployment.yaml")
    args = build_parser().parse_args(["serve", *serve_args(deployment)])
    ports = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
    assert ports == {"http": args.http_port, "grpc": args.grpc_port, "metrics": args.metrics_port}
    assert [str(p) for p in args.model_repository] == [m["mountPath"] for m in container(deployment)["volumeMounts"]
                                                        if m["name"] == "models"]
    assert args.model_control_mode == "poll" and args.admin_token_file is not None
    service_ports = {p["name"]: (p["port"], p["targetPort"]) for p in load("service.yaml")["spec"]["ports"]}
    assert service_ports == {name: (port, name) for name, port in ports.items()}


def test_grace_period_covers_the_drain():
    deployment = load("deployment.yaml")
    args = build_parser().parse_args(["serve", *serve_args(deployment)])
    pre_stop = int(container(deployment)["lifecycle"]["preStop"]["exec"]["command"][-1])
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    needed = pre_stop + args.exit_timeout_secs + FLUSH_GRACE_SECS + UNLOAD_GRACE_SECS
    assert needed <= grace <= needed + 15, (needed, grace)


def test_grpc_probe_variant_differs_only_in_probes():
    http, grpc_variant = load("deployment.yaml"), load("deployment-grpc-probes.yaml")
    for probe in ("startupProbe", "readinessProbe"):
        assert container(grpc_variant)[probe].pop("grpc") == {"port": 8001, "service": ""}
        assert container(http)[probe].pop("httpGet") == {"path": "/v2/health/ready", "port": "http"}
    assert grpc_variant == http


@pytest.mark.parametrize("name", ["hpa.yaml", "hpa-llm.yaml"])
def test_autoscaler_scales_the_deployment_on_a_metric_the_server_exports(name):
    """The HPA's metric is one the adapter rules serve, renamed from a family docs/metrics.md documents
    (which tests/metrics checks against what the server exports)."""
    hpa = load(name)
    assert hpa["spec"]["scaleTargetRef"]["name"] == load("deployment.yaml")["metadata"]["name"]
    [metric] = hpa["spec"]["metrics"]
    rules = yaml.safe_load(load("prometheus-adapter-rules.yaml")["data"]["config.yaml"])["rules"]
    [rule] = [r for r in rules if r["name"]["as"] == metric["pods"]["metric"]["name"]]
    family = rule["name"]["matches"]
    assert rule["seriesQuery"].startswith(family + "{")
    assert f"| `{family}` |" in (K8S.parents[1] / "docs" / "metrics.md").read_text(), family
    assert load("pdb.yaml")["spec"]["selector"] == load("deployment.yaml")["spec"]["selector"]


def test_probes_and_metric_answer_on_a_server_started_with_the_manifest_flags(example_repo, tmp_path):
    """The Deployment's own flags (ports and paths swapped for this machine's) on a real server."""
    deployment = load("deployment.yaml")
    token = tmp_path / "token"
    token.write_text("t0ken")
    args = [a for a in serve_args(deployment) if not a.startswith(("--model-repository", "--admin-token-file",
                                                                    "--http-port", "--grpc-port", "--metrics-port"))]
    with ServerProcess([example_repo], *args, "--admin-token-file", str(token)) as s:
        c = container(deployment)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert httpx.get(f"http://{s.http_url}{c[probe]['httpGet']['path']}").status_code == 200, probe
        variant = container(load("deployment-grpc-probes.yaml"))["readinessProbe"]["grpc"]
        with grpc.insecure_channel(s.grpc_url) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=variant["service"]), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        metric = load("hpa.yaml")["spec"]["metrics"][0]["pods"]["metric"]["name"]
        assert re.search(rf"^{metric}\{{", httpx.get(s.metrics_url).text, re.M), metric


GATED_MODEL = '''
import os, time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # Loads until the test creates the gate file: a model still loading at startup, for as long as needed.
        deadline = time.monotonic() + 60
        while not os.path.exists(os.environ["GATE_FILE"]) and time.monotonic() < deadline:
            time.sleep(0.05)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
'''
BROKEN_MODEL = '''
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("weights missing")
'''
PYTHON_CONFIG = '''backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''


def free_port() -> int:
    # The port file is written only after the initial load, which this test holds open; so the ports are
    # chosen here (a small race with other processes, acceptable for one test).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_readiness_flags_keep_healthy_models_serving(example_repo, tmp_path):
    """The manifest's readiness settings on a real server over a shared repository holding a broken model:
    not ready while the startup load runs (the startup probe and rolling updates wait for the models),
    then ready although one model failed, with the healthy models serving."""
    repo = tmp_path / "repo"
    shutil.copytree(example_repo / "simple", repo / "simple")
    for name, source in (("gated", GATED_MODEL), ("broken", BROKEN_MODEL)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(source)
        (repo / name / "config.pbtxt").write_text(PYTHON_CONFIG)
    gate = tmp_path / "gate"
    args = [a for a in serve_args(load("deployment.yaml")) if not a.startswith((
        "--model-repository", "--admin-token-file", "--http-port", "--grpc-port", "--metrics-port"))]
    assert "--strict-readiness=false" in args and "--exit-on-error=false" in args
    http = free_port()
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "modelplex", "serve", "--host", "127.0.0.1", "--model-repository", str(repo),
         "--http-port", str(http), "--grpc-port", str(free_port()), "--metrics-port", str(free_port()), *args],
        env={**os.environ, "GATE_FILE": str(gate), "MODELPLEX_PLUGINS": "onnx,python"}, stdout=log,
        stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{http}"

    def get(path: str) -> int:  # 0: nothing listening yet
        try:
            return httpx.get(url + path, timeout=2).status_code
        except httpx.TransportError:
            return 0

    try:
        deadline = time.monotonic() + 60
        while get("/v2/health/live") != 200:
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.1)
        while get("/v2/models/simple/ready") != 200:  # the startup load is under way, `gated` held open
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.1)
        assert get("/v2/health/ready") == 400, \
            "ready before the startup load ended: pods would take traffic before their models load"
        gate.touch()
        while get("/v2/health/ready") != 200:
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.1)
        assert get("/v2/models/gated/ready") == 200 and get("/v2/models/simple/ready") == 200
        assert get("/v2/models/broken/ready") == 400
    finally:
        gate.touch()
        server.terminate()
        server.wait(60)
        log.close()
