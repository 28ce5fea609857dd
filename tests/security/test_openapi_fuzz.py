"""schemathesis against the server's own OpenAPI document (`GET /openapi.json`): every operation
gets generated requests, valid and not, and none may be answered with a 5xx (501, "not offered
here", aside). Bounded for CI: a few examples per operation; `benchmarks/fuzz_openapi.py` runs the
longer fuzz."""
from __future__ import annotations

import httpx
import pytest
from helpers.openapi_fuzz import fuzz, load_schema
from helpers.serverproc import ServerProcess
from schemathesis import GenerationMode

EXAMPLES = 12


@pytest.fixture(scope="module")
def fuzzed_server(example_repo):
    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "*",
                       env={"MODELPLEX_PLUGINS": "onnx"}) as s:
        yield s


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_gets_a_server_error(fuzzed_server, mode):
    statuses, server_errors, operations = fuzz(load_schema(fuzzed_server.http_url), EXAMPLES, [mode])
    assert operations >= 40 and sum(statuses.values()) >= operations
    assert not server_errors, "\n".join(server_errors[:20])
    assert httpx.get(f"http://{fuzzed_server.http_url}/v2/health/live", timeout=10).status_code == 200
