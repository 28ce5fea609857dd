"""Admin token, inference API keys and Triton's restricted APIs, on the real server over HTTP and gRPC."""
from __future__ import annotations

import re

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.serverproc import ServerProcess
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from modelplex.core.api_groups import GRPC_METHODS, HTTP_ROUTES
from modelplex_admin.policy import parse_restriction, parse_restrictions

ADMIN, KEY, STATS = "admin-7c1f", "key-42aa", "stats-9"
NO_AUTH, WRONG = {}, {"authorization": "Bearer not-the-token"}
AS_ADMIN, AS_CLIENT = {"authorization": f"Bearer {ADMIN}"}, {"authorization": f"Bearer {KEY}"}
# tritonclient.http adds entries to the headers dict it is given: the HTTP tests pass copies.


@pytest.fixture(scope="module")
def secured(example_repo, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("secrets") / "admin-token"
    token_file.write_text(ADMIN + "\n")
    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "*",
                       "--admin-token-file", str(token_file), "--api-key", KEY,
                       "--http-restricted-api", f"statistics:x-stats-key={STATS}",
                       "--grpc-restricted-protocol", f"statistics:x-stats-key={STATS}") as s:
        yield s


def simple_inputs(module):
    tensors = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    for t in tensors:
        t.set_data_from_numpy(np.ones((1, 16), np.int32))
    return tensors


ADMIN_CALLS = [("POST", "/v2/repository/index"), ("POST", "/v2/repository/models/simple/load"),
               ("POST", "/v2/repository/models/simple_string/unload"), ("GET", "/v2/logging"),
               ("GET", "/v2/trace/setting"), ("GET", "/v2/models/simple/trace/setting"),
               ("POST", "/v2/adapters/x/load"), ("GET", "/v2/some/future/route")]


@pytest.mark.parametrize("method, path", ADMIN_CALLS)
def test_http_admin_routes_need_the_admin_token(secured, method, path):
    url = f"http://{secured.http_url}{path}"
    missing = httpx.request(method, url)
    assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
    assert "admin token" in missing.json()["error"]
    assert httpx.request(method, url, headers=WRONG).status_code == 403
    assert httpx.request(method, url, headers=AS_CLIENT).status_code == 403  # an API key is no admin token


def test_http_admin_token_opens_model_control(secured):
    client = httpclient.InferenceServerClient(secured.http_url)
    client.unload_model("simple_string", headers=dict(AS_ADMIN))
    assert not client.is_model_ready("simple_string")
    client.load_model("simple_string", headers=dict(AS_ADMIN))
    assert client.is_model_ready("simple_string")
    index = client.get_model_repository_index(headers=dict(AS_ADMIN))
    assert {row["name"] for row in index} >= {"simple", "simple_string"}
    assert httpx.get(f"http://{secured.http_url}/v2/logging", headers=AS_ADMIN).status_code == 200


def test_http_inference_needs_an_api_key(secured):
    client = httpclient.InferenceServerClient(secured.http_url)
    for headers, status in ((NO_AUTH, "401"), (WRONG, "403")):
        with pytest.raises(InferenceServerException) as refused:
            client.infer("simple", simple_inputs(httpclient), headers=dict(headers))
        assert refused.value.status() == status
    for headers in (AS_CLIENT, AS_ADMIN):
        assert client.infer("simple", simple_inputs(httpclient), headers=dict(headers)).as_numpy("OUTPUT0").sum() == 32


def test_http_health_and_metadata_stay_open(secured):
    client = httpclient.InferenceServerClient(secured.http_url)
    assert client.is_server_ready() and client.is_model_ready("simple")
    assert client.get_model_metadata("simple")["name"] == "simple"


def test_http_restricted_api_needs_its_header(secured):
    url = f"http://{secured.http_url}/v2/models/simple/stats"
    refused = httpx.get(url)
    assert refused.status_code == 403 and "x-stats-key" in refused.json()["error"]
    assert httpx.get(url, headers={"x-stats-key": "wrong"}).status_code == 403
    assert httpx.get(url, headers={"x-stats-key": STATS}).json()["model_stats"][0]["name"] == "simple"


def grpc_status(call) -> str:
    try:
        call()
    except InferenceServerException as e:
        return e.status()
    return "OK"


def test_grpc_model_control_needs_the_admin_token(secured):
    client = grpcclient.InferenceServerClient(secured.grpc_url)
    calls = {"index": lambda h: client.get_model_repository_index(headers=h),
             "load": lambda h: client.load_model("simple", headers=h),
             "unload": lambda h: client.unload_model("no_such_model", headers=h),
             "log settings": lambda h: client.get_log_settings(headers=h)}
    for name, call in calls.items():
        assert grpc_status(lambda c=call: c(NO_AUTH)) == "StatusCode.UNAUTHENTICATED", name
        assert grpc_status(lambda c=call: c(WRONG)) == "StatusCode.PERMISSION_DENIED", name
        assert grpc_status(lambda c=call: c(AS_CLIENT)) == "StatusCode.PERMISSION_DENIED", name
    assert grpc_status(lambda: calls["index"](AS_ADMIN)) == "OK"
    assert grpc_status(lambda: calls["load"](AS_ADMIN)) == "OK"


def test_grpc_inference_and_streams_need_an_api_key(secured):
    client = grpcclient.InferenceServerClient(secured.grpc_url)
    assert grpc_status(lambda: client.infer("simple", simple_inputs(grpcclient))) == "StatusCode.UNAUTHENTICATED"
    assert grpc_status(lambda: client.infer("simple", simple_inputs(grpcclient), headers=WRONG)) \
        == "StatusCode.PERMISSION_DENIED"
    assert client.infer("simple", simple_inputs(grpcclient), headers=AS_CLIENT).as_numpy("OUTPUT0").sum() == 32
    request = service_pb2.ModelInferRequest(model_name="simple")
    with grpc.insecure_channel(secured.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.ModelStreamInfer(iter([request]), timeout=10))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Authorized, the same stream reaches the model (which answers the empty request in-band).
        answers = list(stub.ModelStreamInfer(iter([request]), metadata=tuple(AS_CLIENT.items()), timeout=10))
        assert len(answers) == 1 and "INPUT0" in answers[0].error_message


def test_grpc_health_stays_open_and_restricted_protocol_applies(secured):
    with grpc.insecure_channel(secured.grpc_url) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
    client = grpcclient.InferenceServerClient(secured.grpc_url)
    assert client.is_server_ready() and client.get_model_metadata("simple").name == "simple"
    assert grpc_status(lambda: client.get_inference_statistics("simple")) == "StatusCode.PERMISSION_DENIED"
    stats = client.get_inference_statistics("simple", headers={"x-stats-key": STATS})
    assert stats.model_stats[0].name == "simple"


def test_grpc_restricted_protocol_takes_tritons_header(secured):
    """Triton's gRPC clients send `triton-grpc-protocol-<key>`; a refusal names that header."""
    client = grpcclient.InferenceServerClient(secured.grpc_url)
    stats = client.get_inference_statistics("simple", headers={"triton-grpc-protocol-x-stats-key": STATS})
    assert stats.model_stats[0].name == "simple"
    with pytest.raises(InferenceServerException) as refused:
        client.get_inference_statistics("simple", headers={"triton-grpc-protocol-x-stats-key": "wrong"})
    assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
    assert "This protocol is restricted, expecting header 'triton-grpc-protocol-x-stats-key'" in refused.value.message()


def test_a_group_restricted_twice_is_refused():
    with pytest.raises(ValueError, match="restricted api 'logging' can not be specified in multiple config groups"):
        parse_restrictions(["logging:k=v", "trace,logging:k2=v2"], "--http-restricted-api")


def declared_http_paths(app):
    def walk(routes):
        for route in routes:
            if hasattr(route, "original_router"):
                yield from walk(route.original_router.routes)
            elif hasattr(route, "path"):
                yield route.path
    # A concrete path per template: every `{param}` (or `{param:path}`) becomes a sample value.
    return {re.sub(r"\{[^}]+\}", "x", path) for path in walk(app.routes)} | {"/v2/models/x/infer"}


def test_every_route_and_method_declares_its_group(example_repo):
    """The datasette rule for access: a route or RPC added without a line in the policy fails here
    (it would otherwise be closed behind the admin token by default)."""
    from modelplex.core.settings import ServerConfig
    from modelplex.http.app import create_http_app
    from modelplex.server.assembly import Server

    server = Server(ServerConfig(model_repositories=[example_repo]))
    app = create_http_app(server.dataplane, server.settings, server._http_routers()).app
    undeclared = [p for p in declared_http_paths(app) if not any(r.fullmatch(p) for r, _ in HTTP_ROUTES)]
    assert not undeclared, f"add these HTTP routes to modelplex.core.api_groups.HTTP_ROUTES: {undeclared}"
    methods = [f"/{service.full_name}/{m.name}" for service in (
        service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"],
        health_pb2.DESCRIPTOR.services_by_name["Health"]) for m in service.methods]
    assert [m for m in methods if m not in GRPC_METHODS] == []


@pytest.mark.parametrize("text", ["statistics", "statistics:key", "statistics:=v", "nonsense:k=v", "inference,:k=v"])
def test_malformed_restriction_is_refused(text):
    with pytest.raises(ValueError):
        parse_restriction(text)


def test_restriction_covers_each_group_named():
    assert parse_restriction("model-repository, logging:Admin-Key=a=b") == {
        "model-repository": ("admin-key", "a=b"), "logging": ("admin-key", "a=b")}
