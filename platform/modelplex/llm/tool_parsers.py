"""Tool calls in a model's text, by the format its family was trained on (the model config parameter
`tool_call_parser`): `hermes` (Hermes, Qwen: `<tool_call>{"name", "arguments"}</tool_call>` blocks after
optional text) and `llama3_json` (Llama 3.x: the whole answer is `{"name", "parameters"}` objects, `;`
between them, optionally after `<|python_tag|>`).

A parser reads a finished text into content and calls, or says it holds no well-formed call (then the
text is plain content, vLLM's behaviour); while streaming, `hold_from` says from where the text may be a
call, which must not go out as content yet. Pure text: no model, no tokenizer.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object


@dataclass(frozen=True)
class ParsedText:
    content: str | None  # the text around the calls (None when there is none)
    calls: list[ParsedCall]


class ToolParser:
    name = ""

    def parse(self, text: str) -> ParsedText | None:
        """Content and calls; None when the text holds no call or a malformed one."""
        raise NotImplementedError

    def hold_from(self, text: str) -> int | None:
        """Where a (possibly still incomplete) call may begin in a streamed text; None: nowhere yet."""
        raise NotImplementedError


def _call(obj, arguments_keys: tuple[str, ...]) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = next((obj[k] for k in arguments_keys if k in obj), {})
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


def _partial_suffix(text: str, tag: str) -> int | None:
    """Start of the longest tail of `text` that is a proper prefix of `tag` (it may become the tag)."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return len(text) - length
    return None


class HermesParser(ToolParser):
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)

    def parse(self, text: str) -> ParsedText | None:
        start = text.find(self.OPEN)
        if start < 0:
            return None
        calls = []
        for body in self._BLOCK.findall(text[start:]):
            try:
                call = _call(json.loads(body), ("arguments", "parameters"))
            except json.JSONDecodeError:
                return None
            if call is None:
                return None
            calls.append(call)
        rest = self._BLOCK.sub("", text[start:]).strip()
        if rest:  # text after the calls: not a clean tool-call answer
            return None
        return ParsedText(text[:start].strip() or None, calls)

    def hold_from(self, text: str) -> int | None:
        start = text.find(self.OPEN)
        return start if start >= 0 else _partial_suffix(text, self.OPEN)


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    TAG = "<|python_tag|>"

    def parse(self, text: str) -> ParsedText | None:
        body = text.strip()
        if body.startswith(self.TAG):
            body = body[len(self.TAG):].strip()
        if not body.startswith("{"):
            return None
        decoder, calls, at = json.JSONDecoder(), [], 0
        while at < len(body):
            try:
                obj, at = decoder.raw_decode(body, at)
            except json.JSONDecodeError:
                return None
            call = _call(obj, ("parameters", "arguments"))
            if call is None:
                return None
            calls.append(call)
            while at < len(body) and body[at] in " \t\r\n;":
                at += 1
        return ParsedText(None, calls)

    def hold_from(self, text: str) -> int | None:
        stripped = text.lstrip()
        if not stripped or stripped.startswith("{") or stripped.startswith(self.TAG) or self.TAG.startswith(stripped):
            return 0
        return None


PARSERS = {parser.name: parser for parser in (HermesParser(), Llama3JsonParser())}
PARSERS["qwen"] = PARSERS["hermes"]  # Qwen 2.5 / 3 use Hermes' format
PARSERS["llama3"] = PARSERS["llama3_json"]


def tool_parser(name: str) -> ToolParser:
    """The parser called `name`; ValueError listing the known ones otherwise."""
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool_call_parser {name!r} (known: {', '.join(sorted(PARSERS))})") from None
