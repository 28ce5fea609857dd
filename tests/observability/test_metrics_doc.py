"""docs/metrics.md documents every family a real server exports after traffic, with its type and labels."""
from __future__ import annotations

import httpx
import numpy as np
import tritonclient.http as httpclient
from helpers.metrics_doc import exported, undocumented
from helpers.serverproc import ServerProcess


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
    families = exported(text)
    assert "nv_inference_request_success" in families and "nv_cpu_utilization" in families
    assert not undocumented(text)
    # Triton's failure reasons are all there, at zero until something fails.
    reasons = {line.split('reason="')[1].split('"')[0] for line in text.splitlines()
               if line.startswith("nv_inference_request_failure{") and 'model="simple"' in line}
    assert reasons == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}
