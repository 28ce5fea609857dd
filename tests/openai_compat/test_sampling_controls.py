"""vLLM's sampling and output fields on the native engine, each checked by what it must change."""
import json

import httpx
import jsonschema
import pytest
from helpers.openai_compat import TOOLS_MODEL as MODEL

PROMPT = "The capital of France is"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def complete(client, **fields):
    fields = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, **fields}
    extra = {k: fields.pop(k) for k in list(fields) if k not in ("model", "prompt", "max_tokens", "temperature",
                                                                   "logprobs", "stream", "stream_options", "n")}
    return client.completions.create(**fields, extra_body=extra)


def token_id(tokenizer, text):
    (found,) = tokenizer.encode(text, add_special_tokens=False)
    return found


def test_logit_bias_and_allowed_token_ids_steer_every_token(client, hf_tokenizer):
    comma = token_id(hf_tokenizer, ",")
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                       logit_bias={str(comma): 100})
    assert answer.choices[0].text == ",,,,"
    allowed = [token_id(hf_tokenizer, t) for t in (" yes", " no")]
    text = complete(client, allowed_token_ids=allowed).choices[0].text
    assert set(hf_tokenizer.encode(text, add_special_tokens=False)) <= set(allowed) and text


def test_min_tokens_holds_back_eos(client):
    plain = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=60, temperature=0)
    assert plain.choices[0].finish_reason == "stop"
    longer = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=60, temperature=0,
                                            extra_body={"min_tokens": plain.usage.completion_tokens + 5})
    assert longer.usage.completion_tokens >= plain.usage.completion_tokens + 5


def test_stop_token_ids_and_stop_strings_in_or_out(client, hf_tokenizer):
    base = complete(client).choices[0].text  # " Paris.\n\nThe ..."
    assert base.startswith(" Paris.")
    answer = complete(client, stop_token_ids=[token_id(hf_tokenizer, ".")])
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].text.startswith(" Paris")
    assert answer.usage.completion_tokens == 2
    assert complete(client, stop=["."]).choices[0].text == " Paris"
    assert complete(client, stop=["."], include_stop_str_in_output=True).choices[0].text == " Paris."


def test_bad_words_are_never_completed(client):
    assert "Paris" in complete(client).choices[0].text
    assert "Paris" not in complete(client, bad_words=["Paris"], max_tokens=8).choices[0].text


def test_skip_special_tokens_false_keeps_the_eos_text(client):
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30, temperature=0,
                                            extra_body={"skip_special_tokens": False})
    assert answer.choices[0].message.content.endswith("<|im_end|>")


def test_truncate_prompt_tokens_keeps_the_last_ones(client):
    answer = complete(client, prompt="one two three four five six seven eight", truncate_prompt_tokens=3)
    assert answer.usage.prompt_tokens == 3


def test_prompt_logprobs_and_priority(client):
    answer = complete(client, prompt_logprobs=2, priority=-5).model_dump()
    found = answer["choices"][0]["prompt_logprobs"]
    assert found[0] is None and len(found) == answer["usage"]["prompt_tokens"]
    assert all(any(v.get("rank") == 1 for v in entry.values()) for entry in found[1:])


def test_continuous_usage_stats(client):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, stream=True,
                                            stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[-1] == 5 and counts[0] < 5
    assert all(c.usage.prompt_tokens == 5 for c in chunks)


@pytest.mark.parametrize("fields, check", [
    ({"guided_choice": ["Paris", "Lyon"]}, lambda t: t in ("Paris", "Lyon")),
    ({"guided_regex": "[0-9]{3}"}, lambda t: len(t) == 3 and t.isdigit()),
    ({"guided_grammar": 'root ::= "yes" | "no"'}, lambda t: t in ("yes", "no")),
    ({"structured_outputs": {"choice": ["up", "down"]}}, lambda t: t in ("up", "down")),
    ({"guided_json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
     lambda t: jsonschema.validate(json.loads(t), {"required": ["n"]}) is None),
])
def test_guided_decoding(client, fields, check):
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30, temperature=0,
                                            extra_body=fields)
    assert check(answer.choices[0].message.content), answer.choices[0].message.content


def test_chat_template_controls(client, base_url, hf_tokenizer):
    prefill = [*QUESTION, {"role": "assistant", "content": "The capital of France is"}]
    answer = client.chat.completions.create(model=MODEL, messages=prefill, max_tokens=3, temperature=0, extra_body={
        "continue_final_message": True, "add_generation_prompt": False})
    assert answer.choices[0].message.content.startswith(" Paris")
    custom = "{% for m in messages %}Q: {{ m.content }}{{ suffix }}\n{% endfor %}A:"
    tokens = httpx.post(f"{base_url}/tokenize", json={"model": MODEL, "messages": QUESTION, "chat_template": custom,
                                                      "chat_template_kwargs": {"suffix": "?!"}}).json()
    text = httpx.post(f"{base_url}/detokenize", json={"model": MODEL, "tokens": tokens["tokens"]}).json()["prompt"]
    assert text == "Q: What is the capital of France??!\nA:"
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3, temperature=0, extra_body={
        "chat_template": custom, "chat_template_kwargs": {"suffix": "?!"}})
    assert answer.usage.prompt_tokens == tokens["count"]


@pytest.mark.parametrize("fields, param", [
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"allowed_token_ids": [10 ** 9]}, "allowed_token_ids"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_grammar": "root ::= nothing"}, "guided_grammar"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_regex"),
    ({"continue_final_message": True}, "continue_final_message"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
    ({"chat_template": "{% if %}"}, "chat_template"),
    ({"truncate_prompt_tokens": 5000}, "truncate_prompt_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"),
])
def test_bad_values_name_the_field(base_url, fields, param):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 4, **fields}
    answer = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text
