"""The OpenAI-compatible routes driven by the official `openai` client against the real server."""
import base64

import numpy as np
import pytest
from helpers.llm_serving import MODEL, QUESTION

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tokenizer(llm_repo):
    from transformers import AutoTokenizer

    folder = llm_repo / MODEL / "1"
    return AutoTokenizer.from_pretrained(folder, gguf_file="model.gguf")


def test_models_lists_llm_and_embedding_models(client):
    ids = [m.id for m in client.models.list().data]
    # minilm_tokenize / minilm / minilm_pool are loaded too, but are neither LLMs nor text -> FP32 models.
    assert ids == ["minilm_pipeline", MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_greedy_answers_paris(client, idle_engine):
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=16)
    assert "Paris" in answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.role == "assistant"
    assert answer.object == "chat.completion" and answer.model == MODEL


def test_completion_usage_counts_tokens(client, tokenizer, idle_engine):
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and choice.text.startswith(" Paris")
    assert answer.usage.prompt_tokens == len(tokenizer.encode(PROMPT, add_special_tokens=False))
    assert answer.usage.completion_tokens == 8 == len(tokenizer.encode(choice.text, add_special_tokens=False))
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 8


def test_chat_usage_counts_the_templated_prompt(client, tokenizer):
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_completion_tokens=4)
    templated = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert answer.usage.prompt_tokens == len(tokenizer.encode(templated, add_special_tokens=False))
    assert answer.usage.completion_tokens == 4 and answer.choices[0].finish_reason == "length"


def test_streaming_chat_with_usage(client, idle_engine):
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=12)
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=12,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and len([c for c in chunks if c.choices]) > 3
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_streaming_completion_without_usage(client):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True))
    assert all(c.usage is None for c in chunks) and chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks).startswith(" Paris")


def test_n_2_gives_two_choices(client, idle_engine):
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, n=2, temperature=1, seed=7, max_tokens=10)
    assert [c.index for c in answer.choices] == [0, 1]
    assert all(c.message.content and c.finish_reason in ("stop", "length") for c in answer.choices)
    assert answer.choices[0].message.content != answer.choices[1].message.content  # each samples on its own
    assert 2 <= answer.usage.completion_tokens <= 20
    streamed = list(client.chat.completions.create(model=MODEL, messages=QUESTION, n=2, temperature=1, seed=7,
                                                   max_tokens=10, stream=True))
    for index in (0, 1):
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices and c.choices[0].index == index)
        assert text == answer.choices[index].message.content


def test_stop_string_ends_the_text(client):
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=16, stop=[" is"])
    assert answer.choices[0].message.content == "The capital of France"
    assert answer.choices[0].finish_reason == "stop"


def test_seed_reproduces_sampled_text(client):
    def sample(seed):
        return client.completions.create(model=MODEL, prompt="Once upon a time", temperature=1.0, seed=seed,
                                         max_tokens=12, extra_body={"ignore_eos": True}).choices[0].text

    first = sample(1234)
    assert sample(1234) == first
    assert {sample(1), sample(2)} != {first}  # other seeds draw other text


def test_logprobs(client):
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=4,
                                            logprobs=True, top_logprobs=2)
    entries = answer.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == answer.choices[0].message.content
    for entry in entries:  # greedy: the chosen token is the most likely one
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].token == entry.token
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob) and entry.logprob <= 0


def test_embeddings_via_minilm_pipeline(client):
    texts = ["A cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell today."]
    answer = client.embeddings.create(model="minilm_pipeline", input=texts)  # the client asks for base64
    vectors = np.array([d.embedding for d in answer.data])
    assert vectors.shape == (3, 384) and [d.index for d in answer.data] == [0, 1, 2]
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    as_floats = client.embeddings.create(model="minilm_pipeline", input=texts[0], encoding_format="float")
    np.testing.assert_allclose(as_floats.data[0].embedding, vectors[0], atol=1e-6)


def test_embeddings_base64_is_little_endian_float32(base_url):
    import httpx

    body = {"model": "minilm_pipeline", "input": "hello", "encoding_format": "base64"}
    encoded = httpx.post(f"{base_url}/v1/embeddings", json=body).json()["data"][0]["embedding"]
    vector = np.frombuffer(base64.b64decode(encoded), dtype="<f4")
    assert vector.shape == (384,) and abs(np.linalg.norm(vector) - 1) < 1e-5


def test_completion_echo_and_streamed_logprobs(client):
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True)
    assert echoed.choices[0].text.startswith(PROMPT + " Paris")
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=1,
                                            stream=True))
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert len(tokens) == 3 and "".join(tokens) == "".join(c.choices[0].text for c in chunks)
