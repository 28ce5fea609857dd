"""The tool-call parsers (modelplex.llm.tool_parsers) on texts as models write them, and what a stream
must hold back while a call may be starting."""
import json

import pytest

from modelplex.llm.tool_parsers import tool_parser

HERMES = tool_parser("hermes")
LLAMA = tool_parser("llama3_json")


def calls(parsed):
    return [(c.name, json.loads(c.arguments)) for c in parsed.calls]


def test_hermes_reads_text_then_calls():
    text = ('Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    parsed = HERMES.parse(text)
    assert parsed.content == "Let me check." and calls(parsed) == [("a", {"x": 1}), ("b", {})]
    unclosed = HERMES.parse('<tool_call>\n{"name": "a", "arguments": {"x": "é"}}')  # EOS before the closing tag
    assert unclosed.content is None and calls(unclosed) == [("a", {"x": "é"})]


@pytest.mark.parametrize("text", ["no call here", '<tool_call>{"name": "a", "arguments": 3}</tool_call>',
                                  '<tool_call>{"name": "a" "arguments": {}}</tool_call>',
                                  '<tool_call>{"arguments": {}}</tool_call>',
                                  '<tool_call>{"name": "a", "arguments": {}}</tool_call> and then text'])
def test_hermes_malformed_or_absent_is_none(text):
    assert HERMES.parse(text) is None


def test_hermes_holds_back_a_possible_tag():
    assert HERMES.hold_from("Sure <tool") == 5 and HERMES.hold_from("Sure <tool_call>{") == 5
    assert HERMES.hold_from("Sure thing") is None and HERMES.hold_from("a < b") is None


def test_llama3_json_reads_one_or_several_objects():
    parsed = LLAMA.parse('<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}')
    assert parsed.content is None and calls(parsed) == [("a", {"x": 1}), ("b", {})]
    assert LLAMA.parse("The answer is 4.") is None and LLAMA.parse('{"name": "a", "parameters": {') is None
    assert LLAMA.hold_from("  {") == 0 and LLAMA.hold_from("<|py") == 0 and LLAMA.hold_from("Hi") is None


def test_unknown_parser_names_the_known_ones():
    with pytest.raises(ValueError, match="hermes"):
        tool_parser("mistral")
