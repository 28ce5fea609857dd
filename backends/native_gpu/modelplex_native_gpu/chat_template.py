"""Chat prompts: the model's own template (tokenizer config or GGUF `tokenizer.chat_template`), rendered by
transformers' Jinja engine, with Gemma's system-prompt folding.

Gemma 2's template refuses a system message; Gemma 3's folds it into the first user turn (the system text,
a blank line, the user text), as llama.cpp does for every Gemma. A template that refuses a conversation
opening with a system message gets it folded that way and is asked once more.
"""
from __future__ import annotations

from modelplex import InvalidInput, llm_protocol

# set by render_chat's own arguments, never through chat_template_kwargs
RESERVED_KWARGS = ("conversation", "tools", "chat_template", "tokenize", "add_generation_prompt",
                   "continue_final_message")


def render_chat(tokenizer, chat: llm_protocol.ChatRequest | list[dict]) -> str:
    """The chat template (the model's, or the request's `chat_template`) over checked messages and tools,
    ending with the assistant's turn opening (unless `add_generation_prompt` is off or
    `continue_final_message` continues the last turn). A bare message list is a ChatRequest of it."""
    if not isinstance(chat, llm_protocol.ChatRequest):
        chat = llm_protocol.ChatRequest(messages=chat)
    if not chat.chat_template and tokenizer.chat_template is None:
        raise InvalidInput("messages: this model has no chat template; send text_input", param="messages")
    kwargs = dict(chat.chat_template_kwargs)
    for reserved in RESERVED_KWARGS:
        if reserved in kwargs:
            raise InvalidInput(f"chat_template_kwargs: '{reserved}' is set by its own field",
                               param="chat_template_kwargs")
    param = "chat_template" if chat.chat_template else "messages"
    # a template may raise anything (jinja raise_exception)
    try:
        return _apply(tokenizer, chat, chat.messages, kwargs)
    except Exception as exc:
        folded = fold_system_prompt(chat.messages)
        if folded is None:
            raise InvalidInput(f"{param}: the chat template refused them: {exc}", param=param) from None
    try:
        return _apply(tokenizer, chat, folded, kwargs)
    except Exception as exc:
        raise InvalidInput(f"{param}: the chat template refused them: {exc}", param=param) from None


def fold_system_prompt(messages: list[dict]) -> list[dict] | None:
    """[system, user, ...] -> [user (system text + blank line + user text), ...]; None when the
    conversation does not open that way (or its contents are not plain text)."""
    if len(messages) < 2 or messages[0].get("role") != "system" or messages[1].get("role") != "user":
        return None
    system, user = messages[0].get("content"), messages[1].get("content")
    if not isinstance(system, str) or not isinstance(user, str):
        return None
    return [{**messages[1], "content": f"{system}\n\n{user}"}, *messages[2:]]


def _apply(tokenizer, chat: llm_protocol.ChatRequest, messages: list[dict], kwargs: dict) -> str:
    # chat_template None: the tokenizer's own (transformers picks among named ones, e.g. "tool_use")
    return tokenizer.apply_chat_template(messages, tools=chat.tools, chat_template=chat.chat_template or None,
                                         add_generation_prompt=chat.add_generation_prompt,
                                         continue_final_message=chat.continue_final_message,
                                         tokenize=False, **kwargs)
