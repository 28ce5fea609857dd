"""Bad requests get OpenAI error objects naming the field, with the right status; nothing leaks."""
import httpx
import openai
import pytest
from helpers.llm_serving import MODEL, QUESTION

LONG_PROMPT = "hello " * 2100  # over max_model_len 2048


@pytest.mark.parametrize("fields, param", [
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 5000}, "max_tokens"),  # prompt + max_tokens over the context length: the engine says so
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_completion_tokens": 5000}, "max_completion_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"stop": [""]}, "stop"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),  # no json_schema.schema
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "string", "minLength": "two"}}}},
     "response_format"),
    ({"messages": [{"content": "no role"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 42}]}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": LONG_PROMPT}]}, "messages"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"model": "minilm_pipeline"}, "model"),
])
def test_chat_bad_input(client, fields, param):
    arguments = {"model": MODEL, "messages": QUESTION, "max_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(**arguments)
    assert error.value.status_code == 400
    assert error.value.body["param"] == param and error.value.body["type"] == "invalid_request_error"
    assert param in error.value.body["message"] or "Unrecognized" in error.value.body["message"]


@pytest.mark.parametrize("fields, param", [
    ({"prompt": LONG_PROMPT}, "prompt"),
    ({"prompt": ["one", ""]}, "prompt"),
    ({"logprobs": 21}, "logprobs"),
    ({"seed": "abc"}, "seed"),
    ({"prompt": [[1, 2, 3], [49152]]}, "prompt"),  # a token id beyond the vocabulary
    ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream: true
])
def test_completion_bad_input(client, fields, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(**{"model": MODEL, "prompt": "Hi", "max_tokens": 4, **fields})
    assert error.value.body["param"] == param


def test_unknown_model_is_404_everywhere(client):
    calls = [lambda: client.chat.completions.create(model="nope", messages=QUESTION),
             lambda: client.completions.create(model="nope", prompt="Hi"),
             lambda: client.embeddings.create(model="nope", input="Hi"),
             lambda: client.models.retrieve("nope")]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as error:
            call()
        assert error.value.body["code"] == "model_not_found" and "nope" in error.value.body["message"]


def test_embeddings_bad_input(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model=MODEL, input="Hi")
    assert error.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model="minilm_pipeline", input="Hi", dimensions=8)
    assert error.value.body["param"] == "dimensions"


def test_malformed_json_body(base_url):
    response = httpx.post(f"{base_url}/v1/chat/completions", content=b"{not json",
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_bad_requests_leave_nothing_behind(client, idle_engine):
    for fields in ({"max_tokens": 5000}, {"messages": [{"role": "user", "content": LONG_PROMPT}]}, {"top_p": 0}):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(**{"model": MODEL, "messages": QUESTION, **fields})
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=16)
    assert "Paris" in answer.choices[0].message.content
    # idle_engine checks on teardown that every KV block is free again and nothing runs or waits
