"""deploy/kubernetes: schema-valid manifests whose probes, ports, flags and shutdown budget match the
real server (container args parsed by the real CLI, probes sent to a real server started with them)."""
from __future__ import annotations

import re
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


@pytest.mark.parametrize("name", sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"))
def test_manifest_is_schema_valid(name):
    for doc in yaml.safe_load_all((K8S / name).read_text()):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


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


def test_autoscaler_scales_the_deployment_on_a_metric_the_server_exports():
    hpa = load("hpa.yaml")
    assert hpa["spec"]["scaleTargetRef"]["name"] == load("deployment.yaml")["metadata"]["name"]
    [metric] = hpa["spec"]["metrics"]
    rules = yaml.safe_load(load("prometheus-adapter-rules.yaml")["data"]["config.yaml"])["rules"]
    assert metric["pods"]["metric"]["name"] in [r["name"]["as"] for r in rules]
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
