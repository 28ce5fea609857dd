"""Function calling on the chat route: what `tools` / `tool_choice` / `parallel_tool_calls` ask of the model,
and each choice's text turned into `tool_calls` (whole, or as OpenAI's streamed deltas).

`auto`: the template sees the tools and the model's family parser (`tool_call_parser`) reads its answer.
`required` and a named function are enforced while sampling by a JSON-schema grammar (xgrammar, through
`structured_outputs`): a named call's output is its arguments object, `required`'s is a list of
`{"name", "parameters"}` objects (vLLM's approach), so neither depends on the model's own format.
A call that does not parse is returned as plain content (with the engine's finish reason), never an error.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from ..llm.tool_parsers import ParsedCall, ToolParser, tool_parser
from .errors import RequestError
from .schemas import ChatCompletionRequest, NamedToolChoice


@dataclass(frozen=True)
class ToolPlan:
    mode: str  # none | auto | required | named
    parser: ToolParser | None = None
    named: str | None = None
    constraint: dict | None = None  # structured_outputs for required / named


def plan_tools(body: ChatCompletionRequest, parser_name: str | None) -> ToolPlan:
    """Check tools and tool_choice against each other and the model's parser; RequestError names the field."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none"):
            raise RequestError("tool_choice", "tool_choice: needs tools")
        return ToolPlan("none")
    tools = {tool.function.name: tool.function for tool in body.tools}
    if len(tools) != len(body.tools):
        raise RequestError("tools", "tools: tool names must be unique")
    if choice == "none":
        return ToolPlan("none")
    if isinstance(choice, NamedToolChoice):
        function = tools.get(choice.function.name)
        if function is None:
            raise RequestError("tool_choice", f"tool_choice: names '{choice.function.name}', which is not in tools")
        return ToolPlan("named", named=function.name, constraint={"json": _parameters(function)})
    if choice == "required":
        return ToolPlan("required", constraint={"json": _required_schema(tools, body.parallel_tool_calls)})
    if not parser_name:
        param = "tools" if choice is None else "tool_choice"
        raise RequestError(param, f"{param}: model '{body.model}' has no tool_call_parser, so 'auto' tool choice is "
                                  "not available (set the model config parameter tool_call_parser, or use "
                                  "tool_choice 'required' or a named function)")
    try:
        return ToolPlan("auto", parser=tool_parser(parser_name))
    except ValueError as exc:
        raise RequestError("tools", f"tools: model '{body.model}': {exc}") from None


def _parameters(function) -> dict:
    return function.parameters or {"type": "object"}


def _required_schema(tools: dict, parallel: bool) -> dict:
    items = [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]},
                                                "parameters": _parameters(function)},
              "required": ["name", "parameters"], "additionalProperties": False}
             for name, function in tools.items()]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _required_calls(text: str) -> list[ParsedCall] | None:
    try:
        found = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(found, list) or not found or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                                           for c in found):
        return None
    return [ParsedCall(c["name"], json.dumps(c.get("parameters", {}), ensure_ascii=False)) for c in found]


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def call_object(call: ParsedCall) -> dict:
    return {"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def message(plan: ToolPlan, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
    """A whole answer's assistant message and finish reason."""
    calls, content = _calls(plan, text)
    if calls is None:
        return {"role": "assistant", "content": text}, finish_reason
    reason = finish_reason if plan.mode == "named" else "tool_calls"
    return {"role": "assistant", "content": content, "tool_calls": [call_object(c) for c in calls]}, reason


def _calls(plan: ToolPlan, text: str) -> tuple[list[ParsedCall] | None, str | None]:
    if plan.mode == "named":
        return ([ParsedCall(plan.named, text.strip())], None) if _is_object(text) else (None, None)
    if plan.mode == "required":
        return _required_calls(text), None
    if plan.mode == "auto":
        parsed = plan.parser.parse(text)
        return (None, None) if parsed is None else (parsed.calls, parsed.content)
    return None, None


@dataclass
class ToolStream:
    """One streamed choice: content deltas go out until a call may begin; calls go out as deltas.

    A named call streams its arguments as they come (the grammar makes the whole output the arguments);
    `required` and `auto` calls go out whole once the text is complete and parses.
    """

    plan: ToolPlan
    text: str = ""
    sent: int = 0  # characters of `text` already sent as content
    num_calls: int = 0
    opened: bool = field(default=False)

    def feed(self, delta: str) -> dict:
        """The delta (OpenAI `delta` object) to send for this much more text ({} when nothing yet)."""
        self.text += delta
        if self.plan.mode == "none":
            self.sent = len(self.text)
            return {"content": delta} if delta else {}
        if self.plan.mode == "named":
            return self._named(delta)
        if self.plan.mode == "required":
            return {}
        hold = self.plan.parser.hold_from(self.text)
        end = len(self.text) if hold is None else max(hold, self.sent)
        return self._content(end)

    def finish(self, finish_reason: str | None) -> tuple[dict, str | None]:
        """The last delta and the finish reason once the engine finished this choice."""
        if self.plan.mode in ("none", "named"):
            return self._content(len(self.text)) if self.plan.mode == "none" else {}, finish_reason
        calls, _ = _calls(self.plan, self.text)
        if calls is None:  # no (well-formed) call: the held text is content after all
            return self._content(len(self.text)), finish_reason
        return {"tool_calls": [{"index": i, **call_object(c)} for i, c in enumerate(calls)]}, "tool_calls"

    def _content(self, end: int) -> dict:
        chunk, self.sent = self.text[self.sent:end], max(self.sent, end)
        return {"content": chunk} if chunk else {}

    def _named(self, delta: str) -> dict:
        if not self.opened:
            self.opened = True
            head = call_object(ParsedCall(self.plan.named, delta))
            return {"tool_calls": [{"index": 0, **head}]}
        return {"tool_calls": [{"index": 0, "function": {"arguments": delta}}]} if delta else {}
