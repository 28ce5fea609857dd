"""Structured output: `response_format` json_object / json_schema enforced by xgrammar token masks.

A request with a response format carries a `GrammarMatcher` (`EngineRequest.grammar`). Before
sampling, the rows that have one get their next-token bitmask and one batched masking call; rows
without one are untouched, so an unconstrained batch pays only a scan for `grammar`. After
sampling, each constrained row's matcher accepts its token. xgrammar is imported on first use, or by
`preload()` when a server creates an engine (see there).
"""
from __future__ import annotations

import json
import logging
import re
import threading
from typing import TYPE_CHECKING

import torch

from ..errors import InvalidRequestError

if TYPE_CHECKING:
    from .request import EngineRequest

logger = logging.getLogger(__name__)
FIELD = "response_format"
TYPES = ("text", "json_object", "json_schema")
JSON_OBJECT = '{"type": "object"}'
_XGRAMMAR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # "[20:29:05] /project/cpp/x.cc:4944: "


def preload() -> None:
    """Import xgrammar now, if installed. It imports transformers and torch, and a first import of those
    on a request's thread could meet another model's load importing them: lazily loaded packages are
    not safe to import from two threads at once. The host runs a backend's first instance creation
    alone, so importing it there is safe."""
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        pass


def check_response_format(value) -> dict | None:
    """The OpenAI shape, checked: None for plain text, else {"type": ..., "json_schema"?: {..., "schema"}}."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in TYPES:
        raise InvalidRequestError(FIELD, f"must be an object with 'type' one of {', '.join(TYPES)}")
    if value["type"] == "text":
        return None
    if value["type"] == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise InvalidRequestError(FIELD, "type 'json_schema' needs json_schema.schema, a JSON Schema object")
    return value


class StructuredOutputs:
    """Compiles response formats for one tokenizer (cached by xgrammar) and makes matchers."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]):
        self.tokenizer, self.vocab_size, self.stop_token_ids = tokenizer, vocab_size, stop_token_ids
        self._compiler = None
        self._lock = threading.Lock()

    def _get_compiler(self):
        with self._lock:  # the first call builds the tokenizer's token table (~0.6 s)
            if self._compiler is None:
                import xgrammar

                if self.tokenizer is None:
                    raise InvalidRequestError(FIELD, "needs the model's tokenizer, which this engine skipped")
                info = xgrammar.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                               stop_token_ids=self.stop_token_ids)
                self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)
            return self._compiler

    def compile(self, response_format: dict):
        """The compiled grammar; an unusable schema raises InvalidRequestError naming response_format.
        Safe from any thread (the serving layer compiles off the event loop before submitting)."""
        compiler = self._get_compiler()
        try:
            if response_format["type"] == "json_object":  # any JSON object (xgrammar's built-in JSON allows arrays)
                return compiler.compile_json_schema(JSON_OBJECT)
            return compiler.compile_json_schema(json.dumps(response_format["json_schema"]["schema"]))
        except (RuntimeError, ValueError, TypeError) as exc:
            reason = _XGRAMMAR_PREFIX.sub("", str(exc)).strip().splitlines()[0]
            raise InvalidRequestError(FIELD, f"invalid JSON schema: {reason}") from None

    @staticmethod
    def matcher(compiled_grammar):
        """A fresh matcher (one completion's position in the grammar)."""
        import xgrammar

        return xgrammar.GrammarMatcher(compiled_grammar)


def apply_grammar_masks(logits: torch.Tensor, requests: list[EngineRequest]) -> None:
    """Mask, in place, the tokens each constrained row's grammar forbids next."""
    rows = [i for i, request in enumerate(requests)
            if request.grammar is not None and not request.grammar.is_terminated()]
    if not rows:
        return
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(len(requests), logits.shape[-1])
    for i in rows:
        requests[i].grammar.fill_next_token_bitmask(bitmask, i)
    xgrammar.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=rows)


def accept_tokens(requests: list[EngineRequest], tokens: list[int]) -> None:
    """Advance each constrained row's grammar by its sampled token."""
    for request, token in zip(requests, tokens):
        if (request.grammar is not None and not request.grammar.is_terminated()
                and not request.grammar.accept_token(token)):
            logger.warning("request %s: grammar refused sampled token %d", request.request_id, token)
