"""schemathesis against the server's own OpenAPI document (`GET /openapi.json`): every operation
gets generated requests, valid and not, and none may be answered with a 5xx (501, "not offered
here", aside). Bounded for CI: a few
examples per operation; `benchmarks/fuzz_openapi.py` runs the longer fuzz."""
from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from serverproc import ServerProcess

# Path parameters drawn from real names (and one unknown) so that requests reach the models.
EXAMPLES = 12
# 501 is a deliberate answer (Triton's: an API this server or this model does not offer), not a fault.
NOT_IMPLEMENTED = 501
NAMES = {"model": ["simple", "simple_string", "no_such_model"], "name": ["simple", "simple_string", "no_such_model"],
         "version": ["1", "2", "x"], "adapter": ["a1", "../etc"]}


@pytest.fixture(scope="module")
def fuzzed_server(example_repo):
    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "*",
                       env={"MODELPLEX_PLUGINS": "onnx"}) as s:
        yield s


@pytest.fixture(scope="module")
def api_schema(fuzzed_server):
    document = httpx.get(f"http://{fuzzed_server.http_url}/openapi.json", timeout=30).json()
    for operations in document["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and parameter["name"] in NAMES:
                    parameter["schema"] = {"type": "string", "enum": NAMES[parameter["name"]]}
    schema = schemathesis.openapi.from_dict(document)
    schema.config.update(base_url=f"http://{fuzzed_server.http_url}")
    return schema


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_gets_a_server_error(api_schema, fuzzed_server, mode):
    """Every operation, `EXAMPLES` generated requests each (schemathesis's pytest plugin does not run
    under this pytest, so hypothesis drives the strategies directly)."""
    server_errors = []
    for result in api_schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def run(case):
            response = case.call(timeout=30)
            if response.status_code >= 500 and response.status_code != NOT_IMPLEMENTED:
                server_errors.append(f"{case.method} {case.formatted_path} -> {response.status_code} "
                                     f"{response.text[:300]} (body {str(case.body)[:200]})")

        try:
            run()
        except Unsatisfiable:  # negative mode: nothing about this operation can be made invalid
            assert mode is GenerationMode.NEGATIVE
    assert not server_errors, "\n".join(server_errors[:20])
    assert httpx.get(f"http://{fuzzed_server.http_url}/v2/health/live", timeout=10).status_code == 200
