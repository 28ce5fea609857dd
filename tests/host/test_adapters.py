"""The host's LoRA adapter contract over a real server and real clients (httpx, openai, the CLI):
listing, loading and unloading through the v2 and vLLM routes, path confinement, static adapters,
`lora` / OpenAI `model` routing, and bad input answered with the reason, changing nothing.

The backend here is a small plugin that answers `<adapter>:<prompt>`; the native engine's adapters
are tested on the real model in tests/multilora.
"""
from __future__ import annotations

import json
import os

import httpx
import openai
import pytest
from helpers.inprocess import server_in_thread

import modelplex
from modelplex import BackendSpec, InvalidInput, ModelInstance, TextChunk
from modelplex.core.settings import ServerConfig
from modelplex.server.cli import main

CONFIG = """backend: "%s"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] optional: true },
        { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


class EchoInstance(ModelInstance):
    """Answers `<adapter or base>:<prompt>` through the typed LLM contract (`generate`); no adapter support."""

    max_concurrency = 8

    def __init__(self, ictx):
        self.model = ictx.model.name

    async def generate(self, inputs):
        yield TextChunk(f"{inputs.lora or 'base'}:{inputs.text}", [0], finish_reason="stop", num_prompt_tokens=1,
                        num_output_tokens=1)


class AdapterEchoInstance(EchoInstance):
    """Takes any folder holding adapter_config.json as an adapter."""

    def __init__(self, ictx):
        super().__init__(ictx)
        self.adapters: dict[str, str] = {}

    async def load_adapter(self, name, path):
        if not (path / "adapter_config.json").is_file():
            raise InvalidInput(f"{path}: adapter_config.json is missing")
        self.adapters[name] = str(path)

    async def unload_adapter(self, name):
        del self.adapters[name]

    def list_adapters(self):
        return [{"name": n, "source": p, "state": "READY", "rank": 8} for n, p in self.adapters.items()]


class ToyPlugin:
    @modelplex.hookimpl
    def modelplex_backends(self):
        return [BackendSpec(name="adapter_echo", create_instance=AdapterEchoInstance, max_concurrency_per_instance=8),
                BackendSpec(name="plain_echo", create_instance=EchoInstance, max_concurrency_per_instance=8)]


def adapter_folder(path):
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16}))
    return path


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    base = tmp_path_factory.mktemp("adapters")
    repo = base / "repo"
    for model, backend in (("toy", "adapter_echo"), ("plain", "plain_echo")):
        (repo / model / "1").mkdir(parents=True)
        (repo / model / "config.pbtxt").write_text(CONFIG % backend)
    adapter_folder(repo / "toy" / "adapters" / "static1")
    roots = base / "roots"
    adapter_folder(roots / "a1")
    adapter_folder(roots / "a2")
    (roots / "broken").mkdir()
    outside = adapter_folder(base / "outside")
    os.symlink(outside, roots / "escape")
    return repo, roots, outside


@pytest.fixture(scope="module")
def url(layout):
    """The server runs on its own event loop in a thread, so that sync clients can drive it."""
    repo, roots, _ = layout
    settings = ServerConfig(model_repositories=[repo], host="127.0.0.1", http_port=0, allow_grpc=False,
                            allow_metrics=False, lora_adapter_roots=[roots])
    with server_in_thread(settings, ToyPlugin()) as url:
        yield url


@pytest.fixture(scope="module")
def http(url):
    with httpx.Client(base_url=url, timeout=30) as client:
        yield client


def names(http, model="toy") -> list[str]:
    response = http.get(f"/v2/repository/models/{model}/adapters")
    assert response.status_code == 200, response.text
    return [row["name"] for row in response.json()]


def generate(http, lora=None, model="toy"):
    body = {"text_input": "hi"} | ({"lora": lora} if lora is not None else {})
    return http.post(f"/v2/models/{model}/generate", json=body)


def load(http, adapter, source=None, model="toy"):
    body = {"parameters": {"source": str(source)}} if source is not None else {}
    return http.post(f"/v2/repository/models/{model}/adapters/{adapter}/load", json=body)


def test_static_adapter_loads_with_the_model(http):
    [row] = http.get("/v2/repository/models/toy/adapters").json()
    assert row["name"] == "static1" and row["origin"] == "static" and row["state"] == "READY" and row["rank"] == 8
    assert row["source"].endswith("toy/adapters/static1")
    assert generate(http, "static1").json()["text_output"] == "static1:hi"
    assert generate(http).json()["text_output"] == "base:hi"
    assert generate(http, "").json()["text_output"] == "base:hi"


def test_load_use_unload_through_the_v2_routes(http, layout):
    _, roots, _ = layout
    assert load(http, "a1", roots / "a1").status_code == 200
    assert names(http) == ["a1", "static1"]
    assert generate(http, "a1").json()["text_output"] == "a1:hi"
    assert http.post("/v2/repository/models/toy/adapters/a1/unload", json={}).status_code == 200
    assert names(http) == ["static1"]
    missing = generate(http, "a1")
    assert missing.status_code == 404 and missing.json() == {"error": "model 'toy' has no adapter 'a1'"}
    # A static adapter unloaded comes back from the model's folder without a source.
    assert http.post("/v2/repository/models/toy/adapters/static1/unload").status_code == 200
    assert load(http, "static1").status_code == 200
    assert names(http) == ["static1"]


def test_openai_model_names_an_adapter_and_vllm_routes_load_it(url, http, layout):
    _, roots, _ = layout
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    answer = http.post("/v1/load_lora_adapter", json={"lora_name": "a2", "lora_path": str(roots / "a2")})
    assert (answer.status_code, answer.text) == (200, "Success: LoRA adapter 'a2' added successfully.")
    cards = {m.id: m for m in client.models.list().data}
    assert cards["a2"].parent == "toy" and cards["static1"].parent == "toy" and cards["toy"].parent is None
    assert client.models.retrieve("a2").parent == "toy"
    completion = client.completions.create(model="a2", prompt="hi", max_tokens=4)
    assert completion.choices[0].text == "a2:hi" and completion.model == "a2"
    assert client.completions.create(model="toy", prompt="hi").choices[0].text == "base:hi"
    answer = http.post("/v1/unload_lora_adapter", json={"lora_name": "a2"})
    assert (answer.status_code, answer.text) == (200, "Success: LoRA adapter 'a2' removed successfully.")
    with pytest.raises(openai.NotFoundError, match="model 'a2' is not found"):
        client.completions.create(model="a2", prompt="hi")
    assert "a2" not in {m.id for m in client.models.list().data}
    gone = http.post("/v1/unload_lora_adapter", json={"lora_name": "a2"})
    assert gone.status_code == 404 and gone.json()["error"]["message"] == "LoRA adapter 'a2' is not loaded"


@pytest.mark.parametrize("adapter, source, status, reason", [
    ("a1", "{outside}", 400, "is outside the allowed adapter folders"),
    ("a1", "{roots}/escape", 400, "is outside the allowed adapter folders"),  # a symlink out of the root
    ("a1", "{roots}/../outside", 400, "is outside the allowed adapter folders"),
    ("a1", "{roots}/nothing", 400, "no adapter folder at"),
    ("a1", "a1", 400, "must be an absolute path"),
    ("broken", "{roots}/broken", 400, "adapter_config.json is missing"),
    ("plain", "{roots}/a1", 400, "adapter name 'plain' is the name of a model"),
    ("static1", "{roots}/a1", 400, "adapter 'static1' is already loaded on model 'toy'"),
    (".hidden", "{roots}/a1", 400, "invalid adapter name"),
    ("a%2Fb", "{roots}/a1", 400, "invalid adapter name"),
])
def test_bad_loads_are_400_with_the_reason_and_change_nothing(http, layout, adapter, source, status, reason):
    _, roots, outside = layout
    before = names(http)
    answer = load(http, adapter, source.format(roots=roots, outside=outside))
    assert answer.status_code == status and reason in answer.json()["error"], answer.text
    assert names(http) == before
    assert generate(http, "static1").json()["text_output"] == "static1:hi"


def test_other_bad_adapter_requests(http, layout):
    _, roots, _ = layout
    assert load(http, "a1", roots / "a1", model="plain").status_code == 501
    assert http.get("/v2/repository/models/plain/adapters").json() == []
    assert load(http, "a1", roots / "a1", model="nope").status_code == 404
    answer = http.post("/v2/repository/models/toy/adapters/a1/load", json={"parameters": {"path": "/x"}})
    assert answer.status_code == 400 and "unknown adapter load parameter 'path'" in answer.json()["error"]
    assert http.post("/v2/repository/models/toy/adapters/zz/unload").status_code == 404
    assert generate(http, "zz").status_code == 404
    assert generate(http, 3).status_code == 400
    # A `lora` on a model without adapters names no adapter it has.
    assert generate(http, "static1", model="plain").status_code == 404
    vllm = http.post("/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(roots / "a1"),
                                                    "load_inplace": True})
    assert vllm.status_code == 400 and vllm.json()["error"]["param"] == "load_inplace"
    assert names(http) == ["static1"]


def test_admin_cli_lists_loads_and_unloads(url, layout, capsys):
    _, roots, _ = layout

    def run(*argv):
        with pytest.raises(SystemExit) as e:
            main(["adapters", *argv, "--url", url])
        return e.value.code, capsys.readouterr()

    code, (out, _) = run("load", "toy", "a1", "--source", str(roots / "a1"))
    assert code == 0 and out == "loaded adapter a1 of toy\n"
    code, (out, _) = run("list", "toy")
    assert code == 0 and out.splitlines()[0].split() == ["NAME", "STATE", "SOURCE"]
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [["a1", "READY"], ["static1", "READY"]]
    assert run("unload", "toy", "a1")[:1] == (0,)
    code, (_, err) = run("load", "toy", "a1", "--source", "/etc")
    assert code == 1 and "the server answered 400" in err and "outside the allowed adapter folders" in err
