"""LoRA adapters on smollm2_ov through the multi-LoRA API (load over HTTP, OpenAI model = adapter, request
parameter `lora`): each request's text equals transformers + PEFT with that adapter, also when two
adapters and the base model are asked at once, and also when adapters switch on the very same prompt
(OpenVINO GenAI's paged prefix cache is not keyed by adapter; the backend keeps it off while adapters
are registered, so a cached prompt of one adapter can never answer for another)."""
from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from helpers.openvino_llm import greedy_reference, link_model, wait_until_idle
from helpers.serverproc import ServerProcess

MODEL = "smollm2_ov"
PROMPTS = ["What is the capital of France?", "Name a fruit that is yellow."]
MAX_TOKENS = 24
ADAPTERS = {"terse": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], seed=1),
            "chatty": dict(r=8, lora_alpha=64, target_modules=["o_proj", "down_proj", "k_proj"], seed=2)}


@pytest.fixture(scope="module")
def adapters(hf_smollm2, tmp_path_factory) -> tuple:
    """Two PEFT adapters with random A and B (PEFT's default B = 0 would change nothing) saved by PEFT,
    and each prompt's greedy text under base, terse and chatty."""
    import torch
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("adapters")
    _, model = hf_smollm2
    references = {"": {p: greedy_reference(hf_smollm2, _chat(p), MAX_TOKENS) for p in PROMPTS}}
    for name, settings in ADAPTERS.items():
        torch.manual_seed(settings["seed"])
        config = LoraConfig(r=settings["r"], lora_alpha=settings["lora_alpha"], init_lora_weights=False,
                            target_modules=settings["target_modules"])
        peft_model = get_peft_model(model, config)
        for parameter in peft_model.parameters():  # PEFT's random init moves this model too far: no text at all
            if parameter.requires_grad:
                parameter.data *= 0.3
        peft_model.save_pretrained(root / name)
        references[name] = {p: greedy_reference((hf_smollm2[0], peft_model), _chat(p), MAX_TOKENS) for p in PROMPTS}
        peft_model.unload()  # the base model is shared with the other tests
    for name in ADAPTERS:
        assert references[name] != references[""], f"adapter {name} changes nothing: the test would prove nothing"
    return root, references


def _chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


@pytest.fixture(scope="module")
def server(smollm2_ov_folder, adapters, tmp_path_factory):
    repo = tmp_path_factory.mktemp("lora_repo")
    link_model(smollm2_ov_folder, repo / MODEL, (smollm2_ov_folder / "config.pbtxt").read_text())
    with ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", MODEL,
                       "--lora-adapter-root", str(adapters[0]), timeout=900) as server:
        for name in ADAPTERS:
            loaded = httpx.post(f"http://{server.http_url}/v2/repository/models/{MODEL}/adapters/{name}/load",
                                json={"parameters": {"source": str(adapters[0] / name)}}, timeout=600)
            assert loaded.status_code == 200, loaded.text
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=300)


def _ask(client, model: str, prompt: str) -> str:
    return client.chat.completions.create(model=model, messages=_chat(prompt), max_tokens=MAX_TOKENS,
                                          temperature=0).choices[0].message.content


def test_adapters_are_listed(server, client):
    listed = httpx.get(f"http://{server.http_url}/v2/repository/models/{MODEL}/adapters").json()
    assert sorted(a["name"] for a in listed) == sorted(ADAPTERS), listed
    assert {m.id for m in client.models.list()} >= {MODEL, *ADAPTERS}


def test_switching_adapters_on_the_same_prompt_gives_each_adapters_text(client, adapters):
    """Base, terse, chatty, base on one prompt in a row: with a prefix cache shared across adapters the
    second answer would reuse the first's KV and come out wrong. (Checked: with prefix caching forced on
    under adapters, terse answers the yellow-fruit prompt with "...Golden Delicious A100." where PEFT
    says "...Golden Delicious A1, which is a type of Golden Delicious".)"""
    references = adapters[1]
    prompts = [p for p in PROMPTS if all(references[n][p] != references[""][p] for n in ADAPTERS)]
    assert prompts, "no prompt that every adapter changes: the test would prove nothing"
    prompt = prompts[0]
    for name in ("", "terse", "chatty", "", "chatty"):
        assert _ask(client, name or MODEL, prompt) == references[name][prompt], name or "base"


def test_concurrent_requests_of_two_adapters_and_the_base(server, client, adapters):
    references = adapters[1]
    asked = [(name, prompt) for prompt in PROMPTS for name in ("terse", "chatty", "")] * 2

    async def all_at_once():
        return await asyncio.gather(*(asyncio.to_thread(_ask, client, name or MODEL, prompt) for name, prompt in asked))

    answers = asyncio.run(all_at_once())
    assert answers == [references[name][prompt] for name, prompt in asked]
    wait_until_idle(server, MODEL)


def test_the_lora_request_parameter_on_generate(server, adapters, hf_smollm2):
    prompt = PROMPTS[1]
    templated = hf_smollm2[0].apply_chat_template(_chat(prompt), add_generation_prompt=True, tokenize=False)
    for name in ("chatty", "", "terse"):
        answer = httpx.post(f"http://{server.http_url}/v2/models/{MODEL}/generate", timeout=120,
                            json={"text_input": templated, "max_tokens": MAX_TOKENS, "temperature": 0,
                                  "parameters": {"lora": name}}).json()
        assert answer["text_output"] == adapters[1][name][prompt], name or "base"


def test_a_bad_adapter_is_refused_with_the_reason(server, adapters, tmp_path):
    import json
    import shutil

    broken = adapters[0] / "too_wide"
    shutil.copytree(adapters[0] / "terse", broken)
    config = json.loads((broken / "adapter_config.json").read_text())
    (broken / "adapter_config.json").write_text(json.dumps({**config, "r": 512}))
    refused = httpx.post(f"http://{server.http_url}/v2/repository/models/{MODEL}/adapters/too_wide/load",
                         json={"parameters": {"source": str(broken)}}, timeout=120)
    assert refused.status_code == 400 and "max_lora_rank" in refused.text
    listed = httpx.get(f"http://{server.http_url}/v2/repository/models/{MODEL}/adapters").json()
    assert "too_wide" not in [a["name"] for a in listed]
