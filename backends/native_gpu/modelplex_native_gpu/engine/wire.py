"""What crosses the pipe between the server and its engine process (core_client.py <-> core_proc.py).

Server -> engine: a list of commands per write: ("add", key, prompt, params, priority, cache_salt, lora),
("abort", key), ("call", call_id, name, args), ("stop",).
Engine -> server, while loading: ("progress", text), then ("ready", info) or ("failed", error); then one
("step", outputs, errors, stats) per engine step (and after commands while idle), ("reply", call_id, error,
stats) per call, and ("fatal", reason) before it exits on a step that raised. Outputs travel as flat
tuples carrying only what is new (token ids, text delta, logprobs); the server adds up the totals.
"""
from __future__ import annotations

import pickle

from .outputs import RequestOutput


def pack(output: RequestOutput) -> tuple:
    """A step's output for one completion, without the totals (the server keeps those)."""
    return (output.request_id, output.index, output.new_token_ids, output.text_delta, output.finished,
            output.finish_reason, output.stop_reason, output.num_prompt_tokens, output.num_generated_tokens,
            output.num_cached_tokens, output.new_logprobs, output.prompt_logprobs, output.arrival_time,
            output.first_scheduled_time, output.first_token_time)


class Totals:
    """One request's token ids and text so far, per completion index, as the server rebuilds them."""

    def __init__(self):
        self.token_ids: dict[int, list[int]] = {}
        self.text: dict[int, str] = {}

    def unpack(self, request_id: str, fields: tuple) -> RequestOutput:
        (_, index, new_ids, delta, finished, finish_reason, stop_reason, num_prompt, num_generated, num_cached,
         new_logprobs, prompt_logprobs, arrival, first_scheduled, first_token) = fields
        token_ids = self.token_ids.setdefault(index, [])
        token_ids += new_ids
        text = self.text[index] = self.text.get(index, "") + delta
        return RequestOutput(request_id, index, new_ids, delta, token_ids, text, finished, finish_reason, stop_reason,
                             num_prompt, num_generated, num_cached, new_logprobs, prompt_logprobs, arrival,
                             first_scheduled, first_token)


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
