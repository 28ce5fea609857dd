"""Limits checked before any work, and the typed contract's bookkeeping, on the real server: a 10 MB
prompt is refused without stalling liveness, `n` is capped on every route, a non-streamed generate
keeps every token's log-probability, and the OpenAI routes count in the model's statistics."""
import json
import queue
import threading
import time

import httpx
import pytest
from helpers.llm_serving import MODEL, grpc_inputs

PROMPT = "The capital of France is"
HUGE = "a" * (10 << 20)  # over the default --max-prompt-bytes (4 MiB)


class LivenessProbe:
    """`/v2/health/live` in a loop on a thread of its own; the slowest answer it saw."""

    def __init__(self, base_url: str):
        self.url, self.slowest, self.count = f"{base_url}/v2/health/live", 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as http:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                assert http.get(self.url).status_code == 200
                self.slowest, self.count = max(self.slowest, time.perf_counter() - t0), self.count + 1
                time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def slowest_liveness(base_url: str, work) -> float:
    """The slowest `/v2/health/live` answer while `work()` runs."""
    with LivenessProbe(base_url) as probe:
        work()
        time.sleep(0.1)
    assert probe.count >= 5, probe.count
    return probe.slowest


@pytest.fixture(scope="module")
def quiet_server(base_url) -> str:
    """The server once liveness answers within 100 ms for a whole second (right after its load it
    stalls now and then, with or without requests), for up to a minute."""
    deadline = time.monotonic() + 60
    while slowest_liveness(base_url, lambda: time.sleep(1.0)) >= 0.1 and time.monotonic() < deadline:
        pass
    return base_url


@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", {"model": MODEL, "prompt": HUGE, "max_tokens": 1}, "prompt"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": HUGE}]}, "messages"),
    (f"/v2/models/{MODEL}/generate", {"text_input": HUGE, "max_tokens": 1}, "text_input"),
])
def test_a_huge_prompt_is_refused_while_liveness_stays_fast(quiet_server, path, body, field):
    base_url = quiet_server
    payload = json.dumps(body).encode()  # encoded before the probe starts: no GIL-bound work beside it
    answers = []
    with httpx.Client(timeout=60) as http:
        def send():
            answers.append(http.post(f"{base_url}{path}", content=payload,
                                     headers={"content-type": "application/json"}))

        # Up to 3 tries: on this shared 2-core machine any process stalls for ~0.5 s now and then, with
        # or without requests; work the request puts on the event loop would stall every try.
        slowest = []
        while len(slowest) < 3 and min(slowest, default=1) >= 0.1:
            slowest.append(slowest_liveness(base_url, send))
    assert min(slowest) < 0.1, slowest
    for answer in answers:
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        if path.startswith("/v1"):
            assert error["param"] == field and "--max-prompt-bytes" in error["message"], error
        else:
            assert error.startswith(f"{field}:") and "--max-prompt-bytes" in error, error


@pytest.mark.parametrize("fields, param", [
    ({"n": 100000}, "n"),
    ({"best_of": 100000}, "best_of"),
    ({"logprobs": 21}, "logprobs"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ({"stop": ["x"] * 65}, "stop"),
    ({"stop": ["x" * 2000]}, "stop"),
    ({"text_input": ""}, "text_input"),
])
def test_generate_refuses_what_is_over_a_limit_at_once(base_url, fields, param):
    t0 = time.monotonic()
    answer = httpx.post(f"{base_url}/v2/models/{MODEL}/generate", json={"text_input": "Hi", "max_tokens": 1, **fields},
                        timeout=30)
    assert answer.status_code == 400 and answer.json()["error"].startswith(f"{param}:"), answer.text
    assert time.monotonic() - t0 < 2


def test_n_over_the_cap_is_refused_on_the_grpc_stream_at_once(llm_server):
    import tritonclient.grpc as grpcclient

    results = queue.Queue()
    client = grpcclient.InferenceServerClient(llm_server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        t0 = time.monotonic()
        client.async_stream_infer(MODEL, grpc_inputs("Hi", {"n": 100000, "max_tokens": 1}), request_id="big-n")
        result, error = results.get(timeout=10)
        elapsed = time.monotonic() - t0
    finally:
        client.stop_stream()
    assert result is None and error is not None and "n: must be an integer in [1, 16]" in str(error), error
    assert elapsed < 2


def test_n_over_the_cap_stays_a_400_on_v1(client):
    import openai

    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=1, n=100000)
    assert error.value.body["param"] == "n"


def test_non_streamed_generate_keeps_every_tokens_logprobs(base_url, idle_engine):
    answer = httpx.post(f"{base_url}/v2/models/{MODEL}/generate", timeout=60, json={
        "text_input": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 2}).json()
    entries = json.loads(answer["logprobs"])
    assert answer["num_output_tokens"] == 5 and len(entries) == 5, answer
    assert "".join(e["token"] for e in entries) == answer["text_output"]
    assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] == e["logprob"] for e in entries)


def test_an_openai_call_counts_in_the_models_statistics(base_url, client):
    def inference_count() -> int:
        (stats,) = httpx.get(f"{base_url}/v2/models/{MODEL}/stats").json()["model_stats"]
        return stats["inference_count"]

    before = inference_count()
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert inference_count() == before + 2


def test_n_counts_against_the_queue_as_n_sequences(base_url, client, idle_engine):
    """The test server runs 2 sequences with 1 waiting at most: n=4 on an idle engine would leave 2
    waiting, so it is refused at once; n=3 leaves 1 and runs."""
    import openai

    with pytest.raises(openai.RateLimitError) as refused:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, n=4, temperature=0.8)
    assert refused.value.response.headers["retry-after"] == "1"
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, n=3, temperature=0.8)
    assert sorted(c.index for c in answer.choices) == [0, 1, 2]
