"""A fleet sharing one repository in poll mode (the shipped Kubernetes settings): a broken model dropped
beside a healthy one must not take either replica out of service."""
from __future__ import annotations

import shutil
import time

import httpx
from helpers.serverproc import ServerProcess

# deploy/kubernetes/configmap.yaml's readiness settings, as every replica runs them.
FLEET_FLAGS = ("--model-control-mode", "poll", "--repository-poll-secs", "0.3", "--strict-readiness=false",
               "--exit-on-error=false")
BODY = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
                   {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]}


def test_a_broken_model_dropped_into_a_shared_repository_leaves_every_replica_ready(example_repo, tmp_path):
    repo = tmp_path / "shared"
    shutil.copytree(example_repo / "simple", repo / "simple")
    with ServerProcess([repo], *FLEET_FLAGS) as first, ServerProcess([repo], *FLEET_FLAGS) as second:
        urls = [f"http://{s.http_url}" for s in (first, second)]
        assert [httpx.get(f"{u}/v2/health/ready").status_code for u in urls] == [200, 200]
        (repo / "broken" / "1").mkdir(parents=True)
        (repo / "broken" / "config.pbtxt").write_text('backend: "no_such_backend"\n')
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(_knows_broken(u) for u in urls):
            time.sleep(0.2)
        assert all(_knows_broken(u) for u in urls), "the replicas never polled the broken model"
        time.sleep(1.0)  # a few more polls: the failure must stay contained
        for url in urls:
            assert httpx.get(f"{url}/v2/health/ready").status_code == 200
            assert httpx.get(f"{url}/v2/models/simple/ready").status_code == 200
            assert httpx.get(f"{url}/v2/models/broken/ready").status_code != 200
            answer = httpx.post(f"{url}/v2/models/simple/infer", json=BODY)
            assert answer.status_code == 200, answer.text
            assert answer.json()["outputs"][0]["data"] == [x + 1 for x in range(16)]


def _knows_broken(url: str) -> bool:
    """Whether the server's repository index lists `broken` with its load failure."""
    index = httpx.post(f"{url}/v2/repository/index", json={}).json()
    return any(row.get("name") == "broken" and row.get("state") == "UNAVAILABLE" for row in index)
