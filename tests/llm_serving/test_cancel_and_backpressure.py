"""Leaving early frees the engine (SSE disconnect, gRPC cancel, a queued client going away), and a full
queue answers 429 (OpenAI routes, with Retry-After) / 503 (v2) at once instead of queueing more.

A long request (1,000 tokens, EOS ignored) would run for many seconds if not aborted, so the
10-second waits below fail when an abort is missed.
"""
import asyncio
import json
import queue
from contextlib import AsyncExitStack

import httpx
import openai
import pytest
from helpers.llm_serving import MODEL, engine_stats, grpc_inputs, wait_for_stats

LONG = {"model": MODEL, "prompt": "Count to a thousand:", "max_tokens": 1000, "ignore_eos": True, "stream": True}


def test_sse_disconnect_aborts_the_request(base_url, idle_engine):
    with httpx.stream("POST", f"{base_url}/v1/completions", json=LONG) as response:
        lines = response.iter_lines()
        assert sum(1 for _, line in zip(range(6), lines) if line.startswith("data: ")) == 3
        busy = engine_stats(base_url)
        assert busy["num_running"] == 1 and busy["num_free_blocks"] < idle_engine["num_free_blocks"]
    wait_for_stats(base_url, num_running=0, num_free_blocks=idle_engine["num_free_blocks"])


def test_grpc_cancel_aborts_the_request(llm_server, base_url, idle_engine):
    """Ten rounds: a cancel that reaches the server while it is sending a response was missed ~1 time in 15."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(llm_server.grpc_url)
    for _ in range(10):
        results = queue.Queue()
        client.start_stream(callback=lambda result, error, results=results: results.put((result, error)))
        try:
            sampling = {"max_tokens": 1000, "ignore_eos": True}
            client.async_stream_infer(MODEL, grpc_inputs("Count to a thousand:", sampling))
            for _ in range(3):
                result, error = results.get(timeout=60)
                assert error is None, error
            assert engine_stats(base_url)["num_running"] == 1
        finally:
            client.stop_stream(cancel_requests=True)
        wait_for_stats(base_url, num_running=0, num_free_blocks=idle_engine["num_free_blocks"])


async def _open_stream(client: httpx.AsyncClient, stack):
    """Start a long SSE completion and wait until it produces text (so it runs in the engine).

    Returns the line iterator: dropping it would close the connection (httpcore closes on GeneratorExit).
    """
    response = await stack.enter_async_context(client.stream("POST", "/v1/completions", json=LONG))
    assert response.status_code == 200
    lines = response.aiter_lines()
    while not (await anext(lines)).startswith("data: "):
        pass
    return lines


async def _poll(client: httpx.AsyncClient, **expected) -> None:
    for _ in range(200):
        (stats,) = (await client.get(f"/v2/models/{MODEL}/engine_stats")).json()["instances"]
        if all(stats[k] == v for k, v in expected.items()):
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"engine never reached {expected}: {stats}")


def test_full_queue_is_refused_and_a_queued_client_leaving_is_dropped(base_url, client, idle_engine):
    """max_num_seqs 2 and max_queue_size 1 (conftest): two run, one waits, the next is refused."""
    async def scenario():
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as http, AsyncExitStack() as stack:
            streams = [await _open_stream(http, stack) for _ in range(2)]
            queued = asyncio.create_task(http.post("/v1/completions", json={**LONG, "stream": False}))
            await _poll(http, num_running=2, num_waiting=1)

            with pytest.raises(openai.RateLimitError) as refused:
                await asyncio.to_thread(client.completions.create, model=MODEL, prompt="Hi", max_tokens=2)
            assert refused.value.status_code == 429 and refused.value.response.headers["retry-after"] == "1"
            assert refused.value.body["code"] == "rate_limit_exceeded" and "wait" in refused.value.body["message"]
            v2 = await http.post(f"/v2/models/{MODEL}/generate", json={"text_input": "Hi", "max_tokens": 2})
            assert v2.status_code == 503 and v2.headers["retry-after"] == "1" and "wait" in v2.json()["error"]

            queued.cancel()  # the client goes away while its request waits: it leaves the queue
            await _poll(http, num_running=2, num_waiting=0)
            assert len(streams) == 2  # both still open here; the exit stack closes them (and aborts their requests)

    asyncio.run(scenario())
    wait_for_stats(base_url, num_running=0, num_waiting=0, num_free_blocks=idle_engine["num_free_blocks"])
    after = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert after.choices[0].text.startswith(" Paris")


def test_sse_body_of_a_refused_stream_is_a_json_error(base_url):
    """A stream refused at admission keeps its status and sends an OpenAI error object, not SSE."""
    with httpx.stream("POST", f"{base_url}/v1/completions", json={**LONG, "max_tokens": 5000}) as response:
        assert response.status_code == 400
        error = json.loads(response.read())["error"]
    assert error["param"] == "max_tokens" and error["type"] == "invalid_request_error"
