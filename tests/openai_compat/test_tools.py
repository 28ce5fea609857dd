"""Function calling on the native engine with a Hermes-style template (helpers/openai_compat.py): the
template sees the tools and the tool turns; `auto` answers are parsed (`tool_call_parser: hermes`),
`required` and named choices are enforced by a JSON-schema grammar; malformed calls come back as text."""
import json
import re

import httpx
import jsonschema
import pytest
from helpers.openai_compat import HERMES_TEMPLATE
from helpers.openai_compat import TOOLS_MODEL as MODEL

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": TIME}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
HISTORY = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]


def rendered(base_url, messages, tools=None):
    body = {"model": MODEL, "messages": messages, "tools": tools, "return_token_strs": False}
    tokens = httpx.post(f"{base_url}/tokenize", json=body).json()["tokens"]
    return httpx.post(f"{base_url}/detokenize", json={"model": MODEL, "tokens": tokens}).json()["prompt"]


def test_the_template_sees_tools_and_tool_turns_as_transformers_renders_them(base_url, hf_tokenizer):
    text = rendered(base_url, HISTORY, TOOLS)
    assert '"name": "get_weather"' in text and "<tools>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text  # the assistant's call
    assert '<tool_response id="call_1">\n18 C and sunny' in text  # the tool turn keeps tool_call_id
    # transformers renders the arguments from an object (the server parsed the client's JSON string)
    parsed = [dict(m, tool_calls=[{**c, "function": {**c["function"], "arguments": json.loads(
        c["function"]["arguments"])}} for c in m["tool_calls"]]) if m.get("tool_calls") else m for m in HISTORY]
    assert text == hf_tokenizer.apply_chat_template(parsed, tools=TOOLS, chat_template=HERMES_TEMPLATE,
                                                    add_generation_prompt=True, tokenize=False)


def test_named_tool_choice_is_enforced(client):
    answer = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=40, temperature=0,
                                            tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = answer.choices[0].message.tool_calls
    assert call.function.name == "get_time" and call.type == "function" and call.id
    jsonschema.validate(json.loads(call.function.arguments), TIME)
    assert answer.choices[0].message.content is None


def test_required_tool_choice_is_enforced_and_parallel_calls_can_be_one(client):
    answer = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=80, temperature=0,
                                            tool_choice="required", parallel_tool_calls=False)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)


def test_auto_tool_call_streams_as_tool_call_deltas(client):
    """The Hermes block is forced by a regex, so the parse and the stream shape are what is tested."""
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=60, stream=True,
                                                 extra_body={"guided_regex": re.escape(CALL)}))
    calls = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name, d.type) for d in calls] == [(0, "get_weather", "function")]
    assert json.loads("".join(d.function.arguments for d in calls)) == {"city": "Paris"}
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)  # nothing leaked as text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=60,
                                           extra_body={"guided_regex": re.escape(CALL)})
    assert whole.choices[0].finish_reason == "tool_calls"
    assert json.loads(whole.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}


def test_named_tool_call_streams_its_arguments(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=40, stream=True,
                                                 temperature=0,
                                                 tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    calls = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "get_weather" and calls[0].id and len(calls) > 2
    jsonschema.validate(json.loads("".join(d.function.arguments or "" for d in calls)), WEATHER)


@pytest.mark.parametrize("text", ['<tool_call>\n{"name": "get_weather", "arguments": oops}\n</tool_call>',
                                  '<tool_call>\n{"arguments": {}}\n</tool_call>'])
def test_a_malformed_call_is_plain_content(client, text):
    for stream in (False, True):
        answer = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=60, stream=stream,
                                                extra_body={"guided_regex": re.escape(text)})
        if stream:
            chunks = [c for c in answer if c.choices]
            content = "".join(c.choices[0].delta.content or "" for c in chunks)
            reason, calls = chunks[-1].choices[0].finish_reason, [c for c in chunks if c.choices[0].delta.tool_calls]
        else:
            content, reason = answer.choices[0].message.content, answer.choices[0].finish_reason
            calls = answer.choices[0].message.tool_calls or []
        assert (content, reason, calls) == (text, "stop", [])


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
])
def test_tool_errors_name_the_field(base_url, fields, param):
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 4, **fields}
    answer = httpx.post(f"{base_url}/v1/chat/completions", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text
