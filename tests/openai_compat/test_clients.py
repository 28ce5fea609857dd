"""Agent frameworks against the server: LangChain's ChatOpenAI with bound tools (one agent step: call,
run the tool, answer) and LiteLLM's completion with tools. Optional test dependencies (pyproject's test
extra); skipped without them."""
import json
import os

import pytest
from helpers.openai_compat import TOOLS_MODEL as MODEL

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}


def test_langchain_bind_tools_agent_step(base_url):
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=f"{base_url}/v1", api_key="unused", temperature=0, max_tokens=40,
                     max_retries=0)
    asked = [HumanMessage("What is the weather in Paris?")]
    step = llm.bind_tools([WEATHER_TOOL], tool_choice="get_weather").invoke(asked)
    (call,) = step.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"].get("city"), str) and call["id"]
    result = ToolMessage(json.dumps({"temperature_c": 18}), tool_call_id=call["id"])
    answer = llm.bind_tools([WEATHER_TOOL]).invoke([*asked, step, result])
    assert answer.content and not answer.tool_calls


def test_litellm_completion_with_tools(base_url):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of its price list at import
    litellm = pytest.importorskip("litellm")
    answer = litellm.completion(model=f"openai/{MODEL}", api_base=f"{base_url}/v1", api_key="unused",
                                messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                                tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False, max_tokens=120,
                                temperature=0)
    assert answer.choices[0].message.tool_calls, answer.choices[0]
    (call,) = answer.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    assert answer.choices[0].finish_reason == "tool_calls"
