"""docs/openai_compat.md against the request schemas and the routes, so the page cannot drift."""
import re
from pathlib import Path

from modelplex.openai.responses_route import ResponsesRequest
from modelplex.openai.schemas import IGNORED, REFUSED, ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from modelplex.openai.utility_routes import DetokenizeRequest, TokenizeRequest

DOC = Path(__file__).resolve().parents[2] / "docs" / "openai_compat.md"
SCHEMAS = {"completions": CompletionRequest, "chat": ChatCompletionRequest, "embeddings": EmbeddingRequest,
           "responses": ResponsesRequest, "tokenize": TokenizeRequest, "detokenize": DetokenizeRequest}
FIELD_ROW = re.compile(r"^\| `(\w+)` \| ([\w, ]+) \| (supported|ignored|refused|warned) \|", re.M)
ROUTE_ROW = re.compile(r"^\| `(GET|POST) (/[^`]*)` \| (supported|refused) \|", re.M)


def declared(schema) -> set[str]:
    return {info.alias or name for name, info in schema.model_fields.items()}


def rows() -> dict[tuple[str, str], str]:
    found = {}
    for field, endpoints, status in FIELD_ROW.findall(DOC.read_text()):
        for endpoint in (e.strip() for e in endpoints.split(",")):
            assert endpoint in SCHEMAS, f"{field}: unknown endpoint {endpoint!r}"
            assert (endpoint, field) not in found, f"{field} on {endpoint} has two rows"
            found[endpoint, field] = status
    return found


def test_every_declared_field_has_its_row_and_status():
    found = rows()
    for endpoint, schema in SCHEMAS.items():
        for field in declared(schema):
            assert (endpoint, field) in found, f"docs/openai_compat.md lacks `{field}` on {endpoint}"
            status = found[endpoint, field]
            assert status != "warned", f"{field} is declared on {endpoint}, so it is not merely warned about"
            if endpoint in ("completions", "chat"):
                expected = "refused" if field in REFUSED else "ignored" if field in IGNORED else None
                assert expected in (None, status), f"{field} on {endpoint}: documented {status}, code {expected}"
                assert status != "ignored" or field in IGNORED, f"{field} is documented ignored; add it to IGNORED"


def test_every_row_names_what_the_schema_does():
    for (endpoint, field), status in rows().items():
        if status == "warned":
            assert field not in declared(SCHEMAS[endpoint]), f"{field} is declared on {endpoint}: not warned"
        else:
            assert field in declared(SCHEMAS[endpoint]), f"{field} is documented on {endpoint} but not declared"


def test_routes_are_those_served():
    from modelplex.core.settings import ServerConfig
    from modelplex.dataplane import DataPlane
    from modelplex.openai import create_openai_router

    router = create_openai_router(DataPlane(ServerConfig(), {}))
    served = {(method, route.path.replace("{model:path}", "{model}")) for route in router.routes
              for method in route.methods}
    served.add(("GET", "/metrics"))  # the server assembly mounts it beside the OpenAI router
    documented = {(m, p): s for m, p, s in ROUTE_ROW.findall(DOC.read_text())}
    for key, status in documented.items():
        assert (key in served) == (status == "supported"), f"{key}: documented {status}"
    missing = {key for key in served if key not in documented and key != ("POST", "/ping")}
    assert not missing, f"undocumented routes: {missing}"
