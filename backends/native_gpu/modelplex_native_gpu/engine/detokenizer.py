"""Incremental detokenization: text deltas that never split a multi-byte character, plus stop strings.

Each step decodes a short window of ids twice (up to the last emitted token, and with the new
ones) and emits the difference; a trailing U+FFFD means an incomplete UTF-8 sequence, so we wait.
"""
from __future__ import annotations

_CONTEXT_TOKENS = 5  # prompt tail decoded along, so the first word's leading space survives


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True,
                 stop: list[str] = (), include_stop_str_in_output: bool = False, min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""
        self.stop = list(stop)
        self.stopped_by: str | None = None
        self.include_stop = include_stop_str_in_output
        self.min_tokens = min_tokens  # stop strings count only from this many output tokens on
        self._num_tokens = 0
        self._num_emitted = 0  # characters of text already returned as deltas

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add_tokens(self, token_ids: list[int]) -> str:
        """Append ids; returns the newly completed text (after truncation at a stop string)."""
        self.ids.extend(token_ids)
        self._num_tokens += len(token_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        delta = new_text[len(prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return self._check_stop(delta)

    def _check_stop(self, delta: str) -> str:
        """Cut the text before the first stop string (which may span deltas).

        With stop strings, the last len(longest stop) - 1 characters are held back, since they
        could still turn out to start a stop string; flush() releases them at the end.
        """
        old_len = len(self.text)
        self.text += delta
        holdback = 0
        if self.stop and self._num_tokens >= self.min_tokens:
            longest = max(len(s) for s in self.stop)
            search_from = max(0, old_len - longest + 1)
            hits = [(pos, s) for s in self.stop if (pos := self.text.find(s, search_from)) >= 0]
            if hits:
                pos, self.stopped_by = min(hits)
                self.text = self.text[:pos + (len(self.stopped_by) if self.include_stop else 0)]
            else:
                holdback = longest - 1
        end = max(self._num_emitted, len(self.text) - holdback)
        out, self._num_emitted = self.text[self._num_emitted:end], end
        return out

    def flush(self) -> str:
        """The held-back tail, once the request has finished."""
        out, self._num_emitted = self.text[self._num_emitted:], len(self.text)
        return out
