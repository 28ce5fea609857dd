"""Triton's trace and log settings through tritonclient over HTTP and gRPC: the same answers, the
same refusals, and a change made through one door is seen through the other."""
from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from helpers.serverproc import ServerProcess
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def clients(example_repo):
    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "simple") as s:
        yield httpclient.InferenceServerClient(s.http_url), grpcclient.InferenceServerClient(s.grpc_url)


def grpc_trace(message) -> dict:
    return {key: list(value.value) if key == "trace_level" else value.value[0]
            for key, value in message.settings.items()}


def test_trace_settings_agree(clients):
    h, g = clients
    assert h.get_trace_settings() == grpc_trace(g.get_trace_settings())
    assert h.get_trace_settings()["trace_level"] == ["OFF"]
    h.update_trace_settings(model_name="simple", settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "5"})
    from_grpc = grpc_trace(g.get_trace_settings(model_name="simple"))
    assert from_grpc == h.get_trace_settings("simple") and from_grpc["trace_rate"] == "5"
    answer = grpc_trace(g.update_trace_settings(model_name="simple", settings={"trace_rate": None, "trace_level": None}))
    assert answer == h.get_trace_settings("simple") == h.get_trace_settings()  # the override is gone
    with pytest.raises(InferenceServerException, match="unknown trace setting 'colour'") as http_error:
        h.update_trace_settings(settings={"colour": "red"})
    with pytest.raises(InferenceServerException, match="unknown trace setting 'colour'") as grpc_error:
        g.update_trace_settings(settings={"colour": "red"})
    assert (http_error.value.status(), grpc_error.value.status()) == ("400", "StatusCode.INVALID_ARGUMENT")


def test_log_settings_agree(clients):
    h, g = clients
    as_dict = json_format.MessageToDict(g.get_log_settings())["settings"]
    grpc_view = {k: next(iter(v.values())) for k, v in as_dict.items()}
    http_view = h.get_log_settings()
    assert {k: str(v) if k == "log_verbose_level" else v for k, v in http_view.items()} == grpc_view | {
        "log_verbose_level": str(http_view["log_verbose_level"])}
    g.update_log_settings({"log_verbose_level": 2, "log_info": False})
    assert h.get_log_settings() | {} == http_view | {"log_verbose_level": 2, "log_info": False}
    h.update_log_settings({"log_verbose_level": 0, "log_info": True})
    assert h.get_log_settings() == http_view
    with pytest.raises(InferenceServerException, match="log_format' must be one of text, json"):
        g.update_log_settings({"log_format": "xml"})
    with pytest.raises(InferenceServerException, match="log_format' must be one of text, json"):
        h.update_log_settings({"log_format": "xml"})
