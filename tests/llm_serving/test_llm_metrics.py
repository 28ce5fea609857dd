"""The `vllm:*` family on the metrics port, scraped with prometheus_client's parser around known traffic:
exact token counters and histogram counts, the engine gauges, and a stream abandoned mid-way leaving the
KV usage gauge where it was.
"""
import time

import httpx
from helpers.llm_serving import MODEL, QUESTION
from helpers.metrics_doc import undocumented
from prometheus_client.parser import text_string_to_metric_families

LABELS = {"model": MODEL, "version": "1", "model_name": MODEL}


def scrape(llm_server) -> dict[str, float]:
    """Every sample of the smollm2 series by name (+ finished_reason / le where present)."""
    text = httpx.get(llm_server.metrics_url).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if {k: labels.pop(k, None) for k in LABELS} != LABELS:
                continue
            key = sample.name + "".join(f"|{k}={v}" for k, v in sorted(labels.items()))
            samples[key] = sample.value
    return samples


def delta(before: dict, after: dict, key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_token_counters_and_histograms_count_known_traffic(llm_server, client, idle_engine):
    before = scrape(llm_server)
    plain = client.completions.create(model=MODEL, prompt="Count: one, two,", max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
    pair = client.completions.create(model=MODEL, prompt="Say hi", max_tokens=4, n=2, temperature=1.0, seed=3,
                                     extra_body={"ignore_eos": True})
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=40, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    after = scrape(llm_server)
    usages = [plain.usage, pair.usage, chunks[-1].usage]

    assert delta(before, after, "vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta(before, after, "vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    # TTFT once per request; e2e once per completion; ITL once per token after a completion's first.
    num_completions = 1 + 2 + 1
    assert delta(before, after, "vllm:time_to_first_token_seconds_count") == 3
    assert delta(before, after, "vllm:e2e_request_latency_seconds_count") == num_completions
    assert delta(before, after, "vllm:inter_token_latency_seconds_count") == (
        sum(u.completion_tokens for u in usages) - num_completions)
    assert delta(before, after, "vllm:time_to_first_token_seconds_bucket|le=+Inf") == 3
    assert delta(before, after, "vllm:e2e_request_latency_seconds_sum") > 0
    assert delta(before, after, "vllm:request_success_total|finished_reason=length") == 3
    assert delta(before, after, "vllm:request_success_total|finished_reason=stop") == 1  # "...is Paris." then EOS
    # Prefix cache: every admitted prompt was looked up.
    assert delta(before, after, "vllm:prefix_cache_queries_total") >= sum(u.prompt_tokens for u in usages)
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0
    assert not undocumented(httpx.get(llm_server.metrics_url).text)


def test_a_stream_abandoned_mid_way_returns_the_kv_gauge(llm_server, base_url, idle_engine):
    idle = scrape(llm_server)
    body = {"model": MODEL, "prompt": "Count to a thousand:", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body) as response:
        lines = response.iter_lines()
        assert sum(1 for _, line in zip(range(6), lines) if line.startswith("data: ")) == 3
        busy = scrape(llm_server)
        assert busy["vllm:num_requests_running"] == 1
        assert busy["vllm:kv_cache_usage_perc"] > idle["vllm:kv_cache_usage_perc"]
    deadline = time.monotonic() + 10
    while (now := scrape(llm_server))["vllm:num_requests_running"] != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert now["vllm:num_requests_running"] == 0
    assert now["vllm:kv_cache_usage_perc"] == idle["vllm:kv_cache_usage_perc"]
    # The abandoned completion counts its tokens but is no finished request.
    assert delta(idle, now, "vllm:generation_tokens_total") >= 3
    assert delta(idle, now, "vllm:e2e_request_latency_seconds_count") == 0
