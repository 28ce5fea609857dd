"""A text-generation model that speaks only the KServe tensor form (as a Python-backend LLM does: no
`generate`) still serves the OpenAI routes: `DataPlane.generate` sends it the tensor request and reads
its responses back as chunks, counted in its statistics. Real server, real openai client."""
from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest
from helpers.inprocess import server_in_thread

import modelplex
from modelplex import BackendSpec, InferResponse, InferTensor, ModelInstance
from modelplex.core.settings import ServerConfig

CONFIG = """backend: "tensor_echo"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] optional: true },
        { name: "messages" data_type: TYPE_STRING dims: [ 1 ] optional: true },
        { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


class TensorEcho(ModelInstance):
    """Streams the prompt (or the last chat message) back one word per response, as the tensor form's
    deltas; the last one has the finish reason and token counts; logprobs when asked for."""

    max_concurrency = 4

    def __init__(self, ictx):
        pass

    async def stream(self, request):
        names = {t.name for t in request.inputs}
        if "messages" in names:
            text = json.loads(request.input("messages").data.reshape(-1)[0])["messages"][-1]["content"]
        else:
            text = request.input("text_input").data.reshape(-1)[0].decode()
        sampling = json.loads(request.input("sampling_parameters").data.reshape(-1)[0])
        words = [w + " " for w in text.split()][:sampling.get("max_tokens", 16)]
        for i, word in enumerate(words):
            parameters = {}
            if sampling.get("logprobs") is not None:
                parameters["logprobs"] = json.dumps([{"token": word, "logprob": -0.5, "top_logprobs": []}])
            if i == len(words) - 1:
                parameters.update(finish_reason="length", num_input_tokens=len(words), num_output_tokens=len(words))
            out = InferTensor.from_numpy("text_output", np.array([word.encode()], dtype=np.object_))
            yield InferResponse("", "", [out], parameters=parameters)


class Plugin:
    @modelplex.hookimpl
    def modelplex_backends(self):
        return [BackendSpec(name="tensor_echo", create_instance=TensorEcho, max_concurrency_per_instance=4)]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    repo = tmp_path_factory.mktemp("tensor_llm")
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "config.pbtxt").write_text(CONFIG)
    settings = ServerConfig(model_repositories=[repo], host="127.0.0.1", http_port=0, allow_grpc=False,
                            allow_metrics=False)
    with server_in_thread(settings, Plugin()) as url:
        yield url


def test_openai_routes_serve_a_tensor_form_model(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    before = httpx.get(f"{url}/v2/models/echo/stats").json()["model_stats"][0]["inference_count"]
    whole = client.completions.create(model="echo", prompt="one two three", max_tokens=8, logprobs=0)
    assert whole.choices[0].text == "one two three " and whole.choices[0].finish_reason == "length"
    assert whole.choices[0].logprobs.tokens == ["one ", "two ", "three "]
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (3, 3)
    streamed = list(client.completions.create(model="echo", prompt="a b c d", max_tokens=3, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == "a b c " and len(streamed) == 3
    chat = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi there"}])
    assert chat.choices[0].message.content == "hi there "
    after = httpx.get(f"{url}/v2/models/echo/stats").json()["model_stats"][0]["inference_count"]
    assert after == before + 3


def test_limits_apply_to_a_tensor_form_model_too(url):
    answer = httpx.post(f"{url}/v1/completions", json={"model": "echo", "prompt": "hi", "stop": ["x"] * 65})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "stop"  # the schema has no bound
    answer = httpx.post(f"{url}/v1/completions", json={"model": "echo", "prompt": "", "max_tokens": 1})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "prompt"
