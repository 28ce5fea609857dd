"""schemathesis over the server's own OpenAPI document (`/openapi.json`): generated requests for every
operation, counted by status, with every 5xx kept (501, "not offered here", is a deliberate answer).
Used by tests/security/test_openapi_fuzz.py (bounded, in CI) and benchmarks/fuzz_openapi.py (long)."""
from __future__ import annotations

import collections

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

NOT_IMPLEMENTED = 501
# Path parameters drawn from real names (and unknown ones) so that requests reach the models.
NAMES = {"model": ["simple", "simple_string", "no_such_model"], "name": ["simple", "simple_string", "no_such_model"],
         "version": ["1", "2", "x"], "adapter": ["a1", "../etc"]}


def load_schema(url: str):
    document = httpx.get(f"http://{url}/openapi.json", timeout=30).json()
    for operations in document["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and parameter["name"] in NAMES:
                    parameter["schema"] = {"type": "string", "enum": NAMES[parameter["name"]]}
    schema = schemathesis.openapi.from_dict(document)
    schema.config.update(base_url=f"http://{url}")
    return schema


def fuzz(schema, examples: int, modes=(GenerationMode.POSITIVE, GenerationMode.NEGATIVE)):
    """(requests by status, the 5xx answers described, number of operations). schemathesis's pytest
    plugin does not run under this pytest, so hypothesis drives its strategies directly."""
    statuses, server_errors, operations = collections.Counter(), [], 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        for mode in modes:
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            def run(case):
                response = case.call(timeout=60)
                statuses[response.status_code] += 1
                if response.status_code >= 500 and response.status_code != NOT_IMPLEMENTED:
                    server_errors.append(f"{case.method} {case.formatted_path} -> {response.status_code} "
                                         f"{response.text[:300]} (body {str(case.body)[:300]})")

            try:
                run()
            except Unsatisfiable:  # negative mode: nothing about this operation can be made invalid
                assert mode is GenerationMode.NEGATIVE
    return statuses, server_errors, operations
