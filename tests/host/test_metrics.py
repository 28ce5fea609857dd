"""Prometheus metrics on the metrics port: Triton's nv_inference_* series move by exactly the traffic sent."""
from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException


def scrape(url: str) -> dict[tuple, float]:
    """Samples keyed by family name: Triton's names carry no `_total` (the parser adds it to samples)."""
    text = httpx.get(url).text
    assert "# TYPE nv_inference_request_success counter" in text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(family.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_inference_counters_follow_traffic(server):
    client = httpclient.InferenceServerClient(server.http_url)
    before = scrape(server.metrics_url)
    inputs = [httpclient.InferInput("INPUT0", [4, 16], "INT32"), httpclient.InferInput("INPUT1", [4, 16], "INT32")]
    for i in inputs:
        i.set_data_from_numpy(np.ones((4, 16), np.int32))
    for _ in range(5):
        client.infer("simple", inputs)
    bad = [httpclient.InferInput("INPUT0", [4, 16], "FP32"), inputs[1]]
    bad[0].set_data_from_numpy(np.ones((4, 16), np.float32))
    with pytest.raises(InferenceServerException):
        client.infer("simple", bad)
    after = scrape(server.metrics_url)
    labels = {"model": "simple", "version": "1"}

    def delta(name, **extra):
        return value(after, name, **labels, **extra) - value(before, name, **labels, **extra)

    assert delta("nv_inference_request_success") == 5
    assert delta("nv_inference_count") == 20  # 5 requests of batch 4
    assert delta("nv_inference_exec_count") == 5
    assert delta("nv_inference_request_failure", reason="OTHER") == 1
    assert delta("nv_inference_request_duration_us") > 0
    assert delta("nv_inference_compute_infer_duration_us") > 0
    assert value(after, "nv_inference_pending_request_count", **labels) == 0
