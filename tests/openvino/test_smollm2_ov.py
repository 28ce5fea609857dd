"""SmolLM2 converted by `modelplex convert-openvino`, served by OpenVINO GenAI's ContinuousBatchingPipeline
behind the same routes as the native engine: OpenAI (streaming too), Triton's generate extension, gRPC
streaming, cancellation, backpressure, bad input and bad model folders.

Greedy text equals transformers' on every prompt below (fp32 both sides: INFERENCE_PRECISION_HINT f32,
which makes the KV cache f32 too; with OpenVINO's default u8/bf16 KV cache, "List three colors of the
rainbow." already answers "red, orange" where transformers says "red, blue", at token 10).
"""
from __future__ import annotations

import asyncio
import json
import queue
import time

import httpx
import numpy as np
import openai
import pytest
from helpers.infer_clients import repository_index
from helpers.openvino_llm import engine_stats, greedy_reference, link_model, ov_llm_config, wait_until_idle
from helpers.serverproc import ServerProcess

MODEL = "smollm2_ov"
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain what a CPU does in two sentences.",
           "List three colors of the rainbow."]
MAX_TOKENS = 40
LONG = {"model": MODEL, "prompt": "Count to a thousand:", "max_tokens": 1000, "ignore_eos": True, "stream": True}
# model -> (what is wrong with it, words its load error must contain)
BAD = {
    "no_tokenizer": (("openvino_tokenizer.xml", "openvino_tokenizer.bin"), {},
                     ["openvino_tokenizer.xml (the tokenizer) is missing"]),
    "no_model_bin": (("openvino_model.bin",), {}, ["openvino_model.bin (the model) is missing"]),
    "precision_i8": ((), {"INFERENCE_PRECISION_HINT": "i8"}, ["INFERENCE_PRECISION_HINT", "'i8'"]),
    "kv_precision_f64": ((), {"KV_CACHE_PRECISION": "f64"}, ["KV_CACHE_PRECISION", "'f64'"]),
    "unknown_parameter": ((), {"max_num_seq": "2"}, ["unknown parameter 'max_num_seq'"]),
}


@pytest.fixture(scope="module")
def server(smollm2_ov_folder, tmp_path_factory):
    repo = tmp_path_factory.mktemp("smollm2_ov_repo")
    link_model(smollm2_ov_folder, repo / MODEL, (smollm2_ov_folder / "config.pbtxt").read_text())
    # One running sequence and one waiting request at most: the backpressure test fills it.
    link_model(smollm2_ov_folder, repo / "tight", ov_llm_config(INFERENCE_PRECISION_HINT="f32", max_num_seqs="1",
                                                                max_queue_size="1"))
    for name, (skip, parameters, _) in BAD.items():
        link_model(smollm2_ov_folder, repo / name, ov_llm_config(**parameters), skip)
    with ServerProcess([repo], "--model-control-mode", "explicit", "--load-model", "*", "--exit-on-error=false",
                       timeout=900) as server:  # the bad folders stay UNAVAILABLE
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def references(hf_smollm2) -> dict[str, str]:
    return {p: greedy_reference(hf_smollm2, [{"role": "user", "content": p}], MAX_TOKENS) for p in PROMPTS}


def test_greedy_chat_equals_transformers(client, references):
    for prompt in PROMPTS:
        answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                                max_tokens=MAX_TOKENS, temperature=0)
        assert answer.choices[0].message.content == references[prompt], prompt
        assert answer.usage.completion_tokens <= MAX_TOKENS and answer.usage.prompt_tokens > 20


def test_streamed_chat_equals_transformers(client, references):
    for prompt in PROMPTS[:2]:
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS, temperature=0,
            stream=True, stream_options={"include_usage": True}))
        deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert "".join(deltas) == references[prompt] and len(deltas) > 3, prompt
        assert chunks[-1].usage.completion_tokens > 3


def test_concurrent_requests_each_get_their_own_text(client, references):
    async def ask(prompt):
        return await asyncio.to_thread(client.chat.completions.create, model=MODEL, temperature=0,
                                       messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS)

    async def all_at_once():
        return await asyncio.gather(*(ask(p) for p in PROMPTS))

    answers = asyncio.run(all_at_once())
    assert [a.choices[0].message.content for a in answers] == [references[p] for p in PROMPTS]


def test_completion_and_generate_agree(server, client):
    text = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                     temperature=0).choices[0].text
    generated = httpx.post(f"http://{server.http_url}/v2/models/{MODEL}/generate", timeout=120,
                           json={"text_input": "The capital of France is", "max_tokens": 8, "temperature": 0}).json()
    assert generated["text_output"] == text and text.startswith(" Paris")


def test_grpc_stream_infer_equals_generate(server):
    import tritonclient.grpc as grpcclient

    sampling = {"max_tokens": 16, "temperature": 0}
    whole = httpx.post(f"http://{server.http_url}/v2/models/{MODEL}/generate", timeout=120,
                       json={"text_input": "Once upon a time", **sampling}).json()["text_output"]
    inputs = [grpcclient.InferInput("text_input", [1], "BYTES"), grpcclient.InferInput("sampling_parameters", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([b"Once upon a time"], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=np.object_))
    results = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(MODEL, inputs, enable_empty_final_response=True)
        deltas = []
        while True:
            result, error = results.get(timeout=120)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                break
            deltas.append(response)
    finally:
        client.stop_stream()
    assert "".join(grpcclient.InferResult(r).as_numpy("text_output")[0].decode() for r in deltas) == whole
    assert deltas[-1].parameters["finish_reason"].string_param == "length" and len(deltas) > 3


def test_sse_disconnect_cancels_the_request(server):
    wait_until_idle(server, MODEL)
    with httpx.stream("POST", f"http://{server.http_url}/v1/completions", json=LONG, timeout=120) as response:
        lines = response.iter_lines()
        assert sum(1 for _, line in zip(range(6), lines) if line.startswith("data: ")) == 3
        assert engine_stats(server, MODEL)["num_in_flight"] == 1
    wait_until_idle(server, MODEL, timeout=10)  # 1,000 tokens would take far longer if it kept running


def test_full_queue_is_refused_at_once(server, client):
    """`tight`: one sequence runs, one request waits, the next is refused (429 on /v1, 503 on /v2)."""
    async def scenario():
        async with httpx.AsyncClient(base_url=f"http://{server.http_url}", timeout=120) as http:
            running = await http.send(http.build_request("POST", "/v1/completions", json={**LONG, "model": "tight"}),
                                      stream=True)
            lines = running.aiter_lines()
            while not (await anext(lines)).startswith("data: "):
                pass
            waiting = asyncio.create_task(http.post("/v1/completions", json={**LONG, "model": "tight", "stream": False}))
            for _ in range(200):
                if engine_stats(server, "tight")["num_in_flight"] == 2:
                    break
                await asyncio.sleep(0.05)
            with pytest.raises(openai.RateLimitError) as refused:
                await asyncio.to_thread(client.completions.create, model="tight", prompt="Hi", max_tokens=2)
            assert refused.value.response.headers["retry-after"] == "1"
            v2 = await http.post("/v2/models/tight/generate", json={"text_input": "Hi", "max_tokens": 2})
            assert v2.status_code == 503 and "wait" in v2.json()["error"]
            waiting.cancel()
            await running.aclose()

    asyncio.run(scenario())
    wait_until_idle(server, "tight", timeout=20)
    after = client.completions.create(model="tight", prompt="The capital of France is", max_tokens=4, temperature=0)
    assert after.choices[0].text.startswith(" Paris")


@pytest.mark.parametrize("fields, param, words", [
    ({"extra_body": {"min_p": 0.2}}, "min_p", "no min-p"),
    ({"logprobs": True, "top_logprobs": 3}, "top_logprobs", "only the chosen token"),
    ({"max_tokens": 5000, "temperature": 0}, None, "context length"),
])
def test_what_openvino_genai_cannot_do_is_a_400_naming_the_field(client, fields, param, words):
    with pytest.raises(openai.BadRequestError) as refused:
        content = "hello " * 2100 if param is None else "Hi"  # over max_model_len 2048 / a fine prompt
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **fields)
    assert words in refused.value.body["message"]
    if param:
        assert refused.value.body["param"] == param


def test_chosen_token_logprobs(client):
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                            temperature=0, logprobs=True)
    entries = answer.choices[0].logprobs.content
    assert len(entries) == answer.usage.completion_tokens and all(e.logprob <= 0 for e in entries)
    assert "".join(e.token for e in entries).startswith(answer.choices[0].message.content[:3])


@pytest.mark.parametrize("model", BAD)
def test_bad_folders_fail_to_load_with_the_reason(server, client, model):
    row = repository_index(server)[model]
    assert row["state"] == "UNAVAILABLE"
    for words in BAD[model][2]:
        assert words in row["reason"], row["reason"]
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0).choices[0].text


def test_models_list_statistics_and_the_llm_metric_family_count_it(server, client):
    from prometheus_client.parser import text_string_to_metric_families

    assert MODEL in [m.id for m in client.models.list()]
    client.completions.create(model=MODEL, prompt="Count to ten:", max_tokens=4, temperature=0,
                              extra_body={"ignore_eos": True})
    stats = httpx.get(f"http://{server.http_url}/v2/models/{MODEL}/stats").json()["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) >= 1
    samples = {(s.name, s.labels.get("model"), s.labels.get("finished_reason")): s.value
               for family in text_string_to_metric_families(httpx.get(server.metrics_url).text)
               for s in family.samples}
    assert samples[("vllm:generation_tokens_total", MODEL, None)] >= 4
    assert samples[("vllm:request_success_total", MODEL, "length")] >= 1
    assert samples[("vllm:time_to_first_token_seconds_count", MODEL, None)] >= 1
    assert samples[("vllm:num_requests_running", MODEL, None)] == 0
    assert 0 <= samples[("vllm:kv_cache_usage_perc", MODEL, None)] <= 1


def test_unloading_stops_the_worker_without_a_traceback(server):
    """Last in this module: unloads `tight` (its worker closes under the reader thread's recv)."""
    r = httpx.post(f"http://{server.http_url}/v2/repository/models/tight/unload", timeout=60)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 60
    while repository_index(server)["tight"]["state"] != "UNAVAILABLE" and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the reader thread notices the closed connection
    assert repository_index(server)["tight"]["state"] == "UNAVAILABLE"
    assert "Traceback" not in server.log(), server.log()[-3000:]
