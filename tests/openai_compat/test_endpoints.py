"""vLLM's utility routes, /metrics on the HTTP port (vLLM's `model_name` label, the request histograms),
/v1/models' max_model_len and the Responses API (text, streaming, function tools)."""
import httpx
from helpers.metrics_doc import undocumented
from helpers.openai_compat import TOOLS_MODEL as MODEL
from helpers.openai_compat import VLLM_MODEL
from prometheus_client.parser import text_string_to_metric_families


def test_health_ping_version(base_url):
    assert httpx.get(f"{base_url}/health").status_code == 200
    assert httpx.get(f"{base_url}/ping").json() == {} and httpx.post(f"{base_url}/ping").status_code == 200
    assert httpx.get(f"{base_url}/version").json()["version"]


def test_tokenize_and_detokenize(base_url, hf_tokenizer):
    answer = httpx.post(f"{base_url}/tokenize", json={"model": MODEL, "prompt": "Hello world",
                                                      "return_token_strs": True}).json()
    assert answer["tokens"] == hf_tokenizer.encode("Hello world") and answer["count"] == len(answer["tokens"])
    assert answer["max_model_len"] == 1024 and "".join(answer["token_strs"]) == "Hello world"
    back = httpx.post(f"{base_url}/detokenize", json={"model": MODEL, "tokens": answer["tokens"]}).json()
    assert back == {"prompt": "Hello world"}
    bad = httpx.post(f"{base_url}/detokenize", json={"model": MODEL, "tokens": [10 ** 9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_models_list_max_model_len(client):
    lengths = {m.id: m.model_extra["max_model_len"] for m in client.models.list().data}
    assert lengths == {MODEL: 1024, VLLM_MODEL: 512}


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_on_the_http_port(base_url, compat_server, client):
    client.completions.create(model=MODEL, prompt="Count: one, two,", max_tokens=4, temperature=0,
                              extra_body={"ignore_eos": True})
    page = httpx.get(f"{base_url}/metrics").text
    found = families(page)
    assert set(found) == set(families(httpx.get(compat_server.metrics_url).text))
    samples = {(s.name, s.labels.get("model_name")): s for f in found.values() for s in f.samples}
    assert samples[("vllm:request_generation_tokens_count", MODEL)].value >= 1
    assert samples[("vllm:request_prompt_tokens_sum", MODEL)].value >= 6
    for name in ("vllm:request_queue_time_seconds_count", "vllm:request_prefill_time_seconds_count",
                 "vllm:request_decode_time_seconds_count", "vllm:request_time_per_output_token_seconds_count"):
        assert samples[(name, MODEL)].value >= 1, name
    (info,) = [s for s in found["vllm:cache_config_info"].samples if s.labels["model"] == MODEL]
    assert info.labels["block_size"] == "16" and int(info.labels["num_gpu_blocks"]) > 0
    assert not undocumented(page)


def test_responses_text_and_stream(client):
    answer = client.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=16,
                                     temperature=0)
    assert "Paris" in answer.output_text and answer.status == "completed"
    instructed = client.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=1,
                                         instructions="Answer briefly.")
    assert instructed.usage.input_tokens > answer.usage.input_tokens and instructed.status == "incomplete"
    assert answer.usage.output_tokens > 0 and answer.usage.total_tokens == answer.usage.input_tokens + \
        answer.usage.output_tokens
    events = list(client.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=16,
                                          temperature=0, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == answer.output_text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_function_tools(client):
    tools = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    answer = client.responses.create(model=MODEL, input="Weather in Paris?", tools=tools, max_output_tokens=80,
                                     temperature=0, tool_choice="required")
    (call,) = [item for item in answer.output if item.type == "function_call"]
    assert call.name == "get_weather" and "city" in call.arguments and call.call_id
    events = list(client.responses.create(model=MODEL, input="Weather in Paris?", tools=tools, max_output_tokens=80,
                                          temperature=0, tool_choice="required", stream=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == call.arguments
    follow_up = client.responses.create(model=MODEL, max_output_tokens=8, temperature=0, tools=tools, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}], tool_choice="none")
    assert follow_up.output_text
