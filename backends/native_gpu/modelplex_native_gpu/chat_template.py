"""Chat prompts: the model's own template (tokenizer config or GGUF `tokenizer.chat_template`), rendered by
transformers' Jinja engine, with Gemma's system-prompt folding.

Gemma 2's template refuses a system message; Gemma 3's folds it into the first user turn (the system text,
a blank line, the user text), as llama.cpp does for every Gemma. A template that refuses a conversation
opening with a system message gets it folded that way and is asked once more.
"""
from __future__ import annotations

from modelplex import InvalidInput


def render_chat(tokenizer, messages: list[dict]) -> str:
    """The model's chat template over checked messages, ending with the assistant's turn opening."""
    if tokenizer.chat_template is None:
        raise InvalidInput("messages: this model has no chat template; send text_input", param="messages")
    try:
        return _apply(tokenizer, messages)
    except Exception as exc:
        folded = fold_system_prompt(messages)
        if folded is None:
            raise InvalidInput(f"messages: the chat template refused them: {exc}", param="messages") from None
    try:
        return _apply(tokenizer, folded)
    except Exception as exc:
        raise InvalidInput(f"messages: the chat template refused them: {exc}", param="messages") from None


def fold_system_prompt(messages: list[dict]) -> list[dict] | None:
    """[system, user, ...] -> [user (system text + blank line + user text), ...]; None when the
    conversation does not open that way (or its contents are not plain text)."""
    if len(messages) < 2 or messages[0].get("role") != "system" or messages[1].get("role") != "user":
        return None
    system, user = messages[0].get("content"), messages[1].get("content")
    if not isinstance(system, str) or not isinstance(user, str):
        return None
    return [{**messages[1], "content": f"{system}\n\n{user}"}, *messages[2:]]


def _apply(tokenizer, messages: list[dict]) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
