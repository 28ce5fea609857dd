"""docs/metrics.md documents every family a real server exports after traffic, with its type and labels."""
from __future__ import annotations

import re
from pathlib import Path

import httpx
import numpy as np
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from serverproc import ServerProcess

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(\w+)` \| (\w+) \| ([^|]*) \|", re.M)


def documented() -> dict[str, tuple[str, set[str]]]:
    rows = {}
    for name, kind, labels in ROW.findall(DOC.read_text()):
        rows[name] = (kind, {label.strip() for label in labels.split(",") if label.strip() not in ("", "—")})
    return rows


def test_every_exported_family_is_documented(ensemble_repo):
    with ServerProcess([ensemble_repo], "--model-control-mode", "explicit", "--load-model", "*") as s:
        client = httpclient.InferenceServerClient(s.http_url)
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(np.ones((1, 16), np.int32))
        client.infer("simple", inputs)
        client.infer("ensemble_add_sub", inputs)
        text = httpx.get(s.metrics_url).text  # the first scrape has no utilization yet (no interval)
        text = httpx.get(s.metrics_url).text
    exported = {}
    for family in text_string_to_metric_families(text):
        labels = {k for sample in family.samples for k in sample.labels}
        exported[family.name] = (family.type, labels)
    assert "nv_inference_request_success" in exported and "nv_cpu_utilization" in exported
    docs = documented()
    missing = sorted(set(exported) - set(docs))
    assert not missing, f"exported but not in {DOC.name}: {missing}"
    for name, (kind, labels) in exported.items():
        assert docs[name] == (kind, labels), f"{name}: exported {kind} {sorted(labels)}, documented {docs[name]}"
    # Triton's failure reasons are all there, at zero until something fails.
    reasons = {line.split('reason="')[1].split('"')[0] for line in text.splitlines()
               if line.startswith("nv_inference_request_failure{") and 'model="simple"' in line}
    assert reasons == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}
