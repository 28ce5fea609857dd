"""Adapters on a real server (SmolLM2 on the native engine): loaded, used, unloaded and reloaded through
the v2 repository API, vLLM's routes and the `openai` client while other requests keep streaming with
no failure; outputs equal transformers + PEFT; bad adapters are refused with the reason."""
from __future__ import annotations

import shutil
import threading
import time

import httpx
import openai
import pytest
import torch
from helpers.lora import make_adapter
from helpers.metrics_doc import undocumented
from helpers.serverproc import ServerProcess

MODEL = "smollm2"
LORA_PARAMETERS = """parameters { key: "max_loras" value { string_value: "2" } }
parameters { key: "max_lora_rank" value { string_value: "16" } }
"""
QUESTION = "What is the capital of France?"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def layout(adapter_dirs, hf_model, tmp_path_factory):
    from build_repository import build

    base = tmp_path_factory.mktemp("lora_serving")
    repo, roots = base / "repo", base / "roots"
    build(repo, [MODEL])
    config = repo / MODEL / "config.pbtxt"
    config.write_text(config.read_text() + LORA_PARAMETERS)
    shutil.copytree(adapter_dirs["tone"], repo / MODEL / "adapters" / "tone")  # static: loads with the model
    for name in ("legal", "code"):
        shutil.copytree(adapter_dirs[name], roots / name)
    make_adapter(hf_model, roots / "too_big", seed=9, r=32, lora_alpha=32, target_modules=["q_proj"])
    return repo, roots


@pytest.fixture(scope="module")
def server(layout):
    repo, roots = layout
    with ServerProcess([repo], "--lora-adapter-root", str(roots), timeout=600) as s:
        yield s


@pytest.fixture(scope="module")
def expected_text(hf_model, adapter_dirs, gguf_path):
    """HF + PEFT greedy chat answers to QUESTION, per adapter (None: the base model)."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    folder, name = gguf_path.rsplit("/", 1)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]

    def greedy(model):
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                                 do_sample=False, pad_token_id=2)
        return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

    texts = {None: greedy(hf_model)}
    for adapter in ("tone", "legal"):
        peft_model = PeftModel.from_pretrained(hf_model, adapter_dirs[adapter])
        texts[adapter] = greedy(peft_model)
        peft_model.unload()
    return texts


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=300)


def chat(client, model: str) -> str:
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                            max_tokens=MAX_TOKENS, temperature=0)
    return answer.choices[0].message.content


class Streams:
    """Streams chat completions (base model and the static adapter, in turn) until stopped; counts failures."""

    def __init__(self, client):
        self.client, self.done, self.failures, self.stop = client, 0, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        models = [MODEL, "tone"]
        while not self.stop.is_set():
            try:
                stream = self.client.chat.completions.create(
                    model=models[self.done % 2], messages=[{"role": "user", "content": "Tell me about cats."}],
                    max_tokens=24, temperature=0, stream=True)
                text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
                assert text, "an empty stream"
                self.done += 1
            except Exception as e:
                self.failures.append(repr(e))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(300)


def test_load_use_unload_reload_while_streams_run(server, client, layout, expected_text):
    _, roots = layout
    http = httpx.Client(base_url=f"http://{server.http_url}", timeout=300)
    base = f"/v2/repository/models/{MODEL}/adapters"
    with Streams(client) as streams:
        assert chat(client, "tone") == expected_text["tone"]  # the static adapter
        assert chat(client, MODEL) == expected_text[None]
        # v2 repository API
        assert http.post(f"{base}/legal/load", json={"parameters": {"source": str(roots / "legal")}}).status_code == 200
        assert chat(client, "legal") == expected_text["legal"]
        answer = http.post(f"/v2/models/{MODEL}/generate", json={"text_input": "Hello", "lora": "legal",
                                                                 "max_tokens": 4, "temperature": 0})
        assert answer.status_code == 200 and answer.json()["text_output"]
        assert http.post(f"{base}/legal/unload").status_code == 200
        with pytest.raises(openai.NotFoundError):
            chat(client, "legal")
        # vLLM's routes; an unload waits for the adapter's running request, which completes
        loaded = http.post("/v1/load_lora_adapter", json={"lora_name": "legal", "lora_path": str(roots / "legal")})
        assert loaded.status_code == 200
        running = client.chat.completions.create(model="legal", messages=[{"role": "user", "content": QUESTION}],
                                                 max_tokens=MAX_TOKENS, temperature=0, stream=True)
        first = next(iter(running))
        started = time.monotonic()
        unloader = threading.Thread(target=lambda: http.post("/v1/unload_lora_adapter", json={"lora_name": "legal"}))
        unloader.start()
        text = (first.choices[0].delta.content or "") + "".join(c.choices[0].delta.content or "" for c in running
                                                               if c.choices)
        unloader.join(120)
        assert text == expected_text["legal"]
        assert time.monotonic() - started < 120
        assert "legal" not in {m.id for m in client.models.list().data}
        time.sleep(1)  # a few more streamed requests after the unload
    assert not streams.failures, streams.failures
    assert streams.done >= 2
    rows = http.get(base).json()
    assert [r["name"] for r in rows] == ["tone"] and rows[0]["origin"] == "static"


@pytest.mark.parametrize("adapter, source, reason", [
    ("too_big", "{roots}/too_big", "rank 32 is over max_lora_rank 16"),
    ("ghost", "{roots}/ghost", "no adapter folder at"),
    ("stray", "/tmp", "outside the allowed adapter folders"),
    ("smollm2", "{roots}/code", "adapter name 'smollm2' is the name of a model"),
])
def test_bad_adapters_are_refused_with_the_reason(server, client, layout, adapter, source, reason):
    _, roots = layout
    http = httpx.Client(base_url=f"http://{server.http_url}", timeout=60)
    answer = http.post(f"/v2/repository/models/{MODEL}/adapters/{adapter}/load",
                       json={"parameters": {"source": source.format(roots=roots)}})
    assert answer.status_code == 400 and reason in answer.json()["error"], answer.text
    assert [r["name"] for r in http.get(f"/v2/repository/models/{MODEL}/adapters").json()] == ["tone"]
    assert chat(client, "tone")


def test_adapter_metrics_are_exported_and_documented(server, client):
    chat(client, "tone")
    text = httpx.get(server.metrics_url).text
    assert not undocumented(text)
    lines = [line for line in text.splitlines() if 'lora_name="tone"' in line]
    requests = [line for line in lines if line.startswith("modelplex:lora_requests_total{")]
    assert requests and float(requests[0].rsplit(" ", 1)[1]) >= 1
    assert any(line.startswith("modelplex:lora_loads_total{") and 'tier="device"' in line for line in lines)
    assert any(line.startswith("vllm:lora_requests_info{") and 'max_lora="2"' in line for line in text.splitlines())
