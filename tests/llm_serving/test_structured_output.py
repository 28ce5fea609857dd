"""`response_format` through the official openai client: output constrained by xgrammar parses and
validates (jsonschema), for one completion, for n=2 sampled ones in the same batch, and streamed."""
import json

import jsonschema
from helpers.llm_serving import MODEL

CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "enum": ["France", "Germany", "Italy"]},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "country", "is_capital"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe Paris as JSON with the keys city, country and is_capital."}]
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}


def test_json_schema_output_parses_and_validates(client, idle_engine):
    answer = client.chat.completions.create(model=MODEL, messages=ASK, response_format=SCHEMA_FORMAT,
                                            max_tokens=120, temperature=0, user="alice")
    choice = answer.choices[0]
    assert choice.finish_reason == "stop", choice.message.content  # the grammar ended it, not max_tokens
    jsonschema.validate(json.loads(choice.message.content), CITY)


def test_sampled_completions_in_one_batch_all_validate(client, idle_engine):
    answer = client.chat.completions.create(model=MODEL, messages=ASK, response_format=SCHEMA_FORMAT,
                                            max_tokens=120, temperature=1.0, seed=7, n=2)
    for choice in answer.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), CITY)


def test_json_object_streamed_parses(client, idle_engine):
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, response_format={"type": "json_object"},
                                                 max_tokens=120, temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop", text
    assert isinstance(json.loads(text), dict)


def test_unconstrained_requests_are_unchanged(client):
    """A plain request beside the constrained ones still answers in prose (its row is not masked)."""
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is the capital "
                                                                   "of France?"}], max_tokens=12, temperature=0)
    assert plain.choices[0].message.content.startswith("The capital of France is Paris")


def test_generate_takes_the_same_response_format(base_url, idle_engine):
    import httpx

    prompt = "<|im_start|>user\nDescribe Paris as JSON.<|im_end|>\n<|im_start|>assistant\n"
    answer = httpx.post(f"{base_url}/v2/models/{MODEL}/generate", timeout=120,
                        json={"text_input": prompt, "max_tokens": 120, "temperature": 0,
                              "response_format": SCHEMA_FORMAT}).json()
    assert answer["finish_reason"] == "stop", answer
    jsonschema.validate(json.loads(answer["text_output"]), CITY)
