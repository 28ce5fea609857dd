"""deploy/helm/modelplex, checked without a helm binary (none installs offline here): every value a
template reads exists, actions are balanced, and the chart's defaults say what deploy/kubernetes says."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "modelplex"
K8S = ROOT / "deploy" / "kubernetes"
TEMPLATES = {p.name: p.read_text() for p in (CHART / "templates").iterdir()}
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def k8s(name: str) -> dict:
    return yaml.safe_load((K8S / name).read_text())


def test_chart_metadata():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "modelplex" and chart["version"]


def test_every_value_a_template_reads_exists():
    for name, text in TEMPLATES.items():
        for path in re.findall(r"\.Values((?:\.\w+)+)", text):
            node = VALUES
            for key in path.strip(".").split("."):
                assert isinstance(node, dict) and key in node, f"{name}: .Values{path} is not in values.yaml"
                node = node[key]


def test_actions_are_balanced():
    for name, text in TEMPLATES.items():
        actions = re.findall(r"\{\{-?\s*(if|with|range|define|else|end)\b", text)
        depth = 0
        for action in actions:
            depth += {"if": 1, "with": 1, "range": 1, "define": 1, "end": -1}.get(action, 0)
            assert depth >= 0, f"{name}: 'end' without an opening action"
        assert depth == 0, f"{name}: unclosed action"
        assert text.count("{{") == text.count("}}"), name


def test_templates_make_the_same_objects_as_the_plain_manifests():
    kinds = {kind for text in TEMPLATES.values() for kind in re.findall(r"^kind: (\w+)$", text, re.M)}
    plain = {k8s(p)["kind"] for p in ("configmap.yaml", "deployment.yaml", "service.yaml", "pdb.yaml", "hpa.yaml")}
    assert kinds == plain


def test_deployment_template_sets_the_same_flags_and_probes():
    template = TEMPLATES["deployment.yaml"]
    template_args = re.findall(r"^\s+- (--[\w-]+)=", template, re.M)
    [plain] = k8s("deployment.yaml")["spec"]["template"]["spec"]["containers"]
    assert sorted(template_args) == sorted(re.match(r"--[\w-]+", a)[0] for a in plain["args"])
    for path in ("/v2/health/ready", "/v2/health/live"):
        assert path in template + TEMPLATES["_helpers.tpl"]
    assert 'grpc: {port: {{ .Values.ports.grpc }}, service: ""}' in TEMPLATES["_helpers.tpl"]


def test_default_values_match_the_plain_manifests():
    flags = k8s("configmap.yaml")["data"]
    server = VALUES["server"]
    assert str(server["exitTimeoutSecs"]) == flags["EXIT_TIMEOUT_SECS"]
    assert server["modelControlMode"] == flags["MODEL_CONTROL_MODE"]
    spec = k8s("deployment.yaml")["spec"]["template"]["spec"]
    # The template's terminationGracePeriodSeconds: preStop + exit timeout + 10.
    assert VALUES["preStopSleepSecs"] + server["exitTimeoutSecs"] + 10 == spec["terminationGracePeriodSeconds"]
    assert "add .Values.preStopSleepSecs .Values.server.exitTimeoutSecs 10" in TEMPLATES["deployment.yaml"]
    assert {p["name"]: p["containerPort"] for p in spec["containers"][0]["ports"]} == VALUES["ports"]
    hpa = k8s("hpa.yaml")["spec"]
    assert VALUES["autoscaling"]["metric"] == hpa["metrics"][0]["pods"]["metric"]["name"]
    assert VALUES["modelRepository"]["existingClaim"] == spec["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert {"devices", "resources", "modelRepository"} <= VALUES.keys()
