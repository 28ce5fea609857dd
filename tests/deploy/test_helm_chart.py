"""deploy/helm/modelplex rendered by the real Helm (`make test` installs it into the venv through
deploy/helm/fetch_helm.py; without it the render tests skip and only the static checks run): every object
schema-valid, the defaults those of deploy/kubernetes, and what a fresh install needs made by the chart."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from modelplex.server.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "modelplex"
K8S = ROOT / "deploy" / "kubernetes"
TEMPLATES = {p.name: p.read_text() for p in (CHART / "templates").iterdir()}
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
KUBERNETES_VERSION = "1.30.0"
CUSTOM_KINDS = {"ServiceMonitor"}  # not in kubernetes-validate's schemas (a CRD)


def k8s(name: str) -> dict:
    return yaml.safe_load((K8S / name).read_text())


def helm_binary() -> str:
    found = shutil.which("helm") or shutil.which("helm", path=str(Path(sys.executable).parent))
    if found is None:
        # CI must not pass by skipping the chart's only real check.
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "no helm binary (make test installs one: deploy/helm/fetch_helm.py)")
    return found


def render(*options: str, release: str = "rel") -> dict[tuple[str, str], dict]:
    """`helm template` with `--set` style options: {(kind, name): object}."""
    done = subprocess.run([helm_binary(), "template", release, str(CHART), *options],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def pod_spec(objects) -> dict:
    return objects[("Deployment", "rel")]["spec"]["template"]["spec"]


def validate(objects) -> None:
    for obj in objects.values():
        if obj["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


# ---- without helm ---------------------------------------------------------------------------------

def test_chart_metadata():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "modelplex" and chart["version"]


def test_every_value_a_template_reads_exists():
    """Helm renders a misspelled value as empty, silently: every .Values path must be in values.yaml."""
    for name, text in TEMPLATES.items():
        for path in re.findall(r"\.Values((?:\.\w+)+)", text):
            node = VALUES
            for key in path.strip(".").split("."):
                assert isinstance(node, dict) and key in node, f"{name}: .Values{path} is not in values.yaml"
                node = node[key]


def test_templates_make_the_same_objects_as_the_plain_manifests():
    """The same kinds as deploy/kubernetes (whose Secret comes from kustomize's secretGenerator)."""
    kinds = {kind for text in TEMPLATES.values() for kind in re.findall(r"^kind: (\w+)$", text, re.M)}
    plain = {doc["kind"] for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"
             for doc in yaml.safe_load_all(p.read_text())}
    assert kinds == plain | {"Secret"}


# ---- rendered ---------------------------------------------------------------------------------------

def test_lint():
    done = subprocess.run([helm_binary(), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_default_install_makes_everything_its_pods_mount():
    """A fresh `helm install`: the admin Secret and the models claim are made by the chart, so no pod
    waits for an object nobody creates; every object is schema-valid."""
    objects = render()
    validate(objects)
    pod = pod_spec(objects)
    for volume in pod["volumes"]:
        if "secret" in volume:
            assert ("Secret", volume["secret"]["secretName"]) in objects, volume
        if "persistentVolumeClaim" in volume:
            claim = objects[("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])]
            assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"  # models outlive the release
    assert len(objects[("Secret", "rel-admin")]["data"]["token"]) >= 32
    account = objects[("ServiceAccount", pod["serviceAccountName"])]
    assert account["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False


def test_defaults_match_the_plain_manifests():
    """Same flags, probes, security settings and shutdown budget as deploy/kubernetes/deployment.yaml."""
    objects = render()
    [rendered] = pod_spec(objects)["containers"]
    plain_pod = k8s("deployment.yaml")["spec"]["template"]["spec"]
    [plain] = plain_pod["containers"]
    for field in ("startupProbe", "livenessProbe", "readinessProbe", "securityContext", "resources", "ports",
                  "lifecycle"):
        assert rendered[field] == plain[field], field
    assert rendered["args"] == plain["args"]
    for field in ("securityContext", "terminationGracePeriodSeconds", "automountServiceAccountToken"):
        assert pod_spec(objects)[field] == plain_pod[field], field
    assert objects[("ConfigMap", "rel-flags")]["data"] == k8s("configmap.yaml")["data"]
    hpa = objects[("HorizontalPodAutoscaler", "rel")]["spec"]
    assert hpa["metrics"] == k8s("hpa.yaml")["spec"]["metrics"]


def test_rendered_args_are_valid_server_flags():
    objects = render()
    [container] = pod_spec(objects)["containers"]
    flags = objects[("ConfigMap", "rel-flags")]["data"]
    args = [re.sub(r"\$\((\w+)\)", lambda m: flags[m[1]], a) for a in container["args"]]
    parsed = build_parser().parse_args(["serve", *args])
    assert parsed.strict_readiness is False and parsed.model_control_mode == "poll"


def test_existing_secret_and_claim_are_used_not_made():
    objects = render("--set", "admin.existingSecret=ops-token", "--set", "modelRepository.existingClaim=shared")
    validate(objects)
    assert not any(kind in ("Secret", "PersistentVolumeClaim") for kind, _ in objects)
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    assert volumes["admin-token"]["secret"]["secretName"] == "ops-token"
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "shared"


def test_without_an_admin_token_nothing_points_at_one():
    objects = render("--set", "admin.createSecret=false")
    validate(objects)
    pod = pod_spec(objects)
    assert not any(kind == "Secret" for kind, _ in objects)
    assert not any(a.startswith("--admin-token-file") for a in pod["containers"][0]["args"])
    assert "admin-token" not in {v["name"] for v in pod["volumes"]}


def test_a_release_without_a_model_repository_is_refused():
    done = subprocess.run([helm_binary(), "template", "rel", str(CHART), "--set",
                           "modelRepository.persistence.create=false"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "modelRepository" in done.stderr, done.stderr


def test_optional_objects_and_pod_placement(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "networkPolicy": {"enabled": True}, "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
        "probes": {"protocol": "grpc"}, "podAnnotations": {"example.com/team": "ml"},
        "nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
                "matchLabels": {"app.kubernetes.io/name": "modelplex"}}}}]}},
        "devices": {"nvidia.com/gpu": 1}, "serviceAccount": {"create": False, "name": "ml-runner"}}))
    objects = render("-f", str(values))
    validate(objects)
    pod = pod_spec(objects)
    assert pod["nodeSelector"] == {"pool": "gpu"} and pod["tolerations"] and pod["affinity"]
    assert pod["serviceAccountName"] == "ml-runner" and not any(k == "ServiceAccount" for k, _ in objects)
    template = objects[("Deployment", "rel")]["spec"]["template"]
    assert template["metadata"]["annotations"]["example.com/team"] == "ml"
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    [container] = pod["containers"]
    assert container["readinessProbe"]["grpc"] == {"port": 8001, "service": ""}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    service = objects[("Service", "rel")]
    monitor = objects[("ServiceMonitor", "rel")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    policy = objects[("NetworkPolicy", "rel")]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert {p["port"] for rule in policy["ingress"] for p in rule["ports"]} == {p["name"] for p in
                                                                                service["spec"]["ports"]}
