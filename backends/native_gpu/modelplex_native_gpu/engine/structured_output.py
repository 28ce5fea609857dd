"""Structured output: `response_format` json_object / json_schema and vLLM's `structured_outputs` (json,
regex, choice, grammar, json_object) enforced by xgrammar token masks.

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


CONSTRAINT_KINDS = ("json", "regex", "choice", "grammar", "json_object")
SO_FIELD = "structured_outputs"


def check_structured_outputs(value) -> dict | None:
    """vLLM's StructuredOutputsParams, checked: exactly one kind, of the right type; None if empty."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequestError(SO_FIELD, f"must be an object with one of {', '.join(CONSTRAINT_KINDS)}")
    unknown = sorted(set(value) - set(CONSTRAINT_KINDS) - {"disable_any_whitespace", "disable_fallback",
                                                            "disable_additional_properties", "whitespace_pattern"})
    if unknown:
        raise InvalidRequestError(SO_FIELD, f"unknown key(s) {', '.join(unknown)} "
                                            f"(known: {', '.join(CONSTRAINT_KINDS)})")
    given = {k: v for k, v in value.items() if k in CONSTRAINT_KINDS and v not in (None, False)}
    if not given:
        return None
    if len(given) > 1:
        raise InvalidRequestError(SO_FIELD, f"give one constraint, got {', '.join(sorted(given))}")
    kind, spec = next(iter(given.items()))
    if kind == "json" and isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(SO_FIELD, f"json: not a JSON schema ({exc.msg})") from None
    valid = {"json": isinstance(spec, dict), "regex": isinstance(spec, str) and spec,
             "grammar": isinstance(spec, str) and spec, "json_object": spec is True,
             "choice": isinstance(spec, list) and spec and all(isinstance(c, str) for c in spec)}[kind]
    if not valid:
        raise InvalidRequestError(SO_FIELD, f"{kind}: wrong type or empty")
    return {kind: spec}


def response_format_constraint(response_format: dict) -> dict:
    """A checked response_format (json_object / json_schema) in structured_outputs' shape."""
    if response_format["type"] == "json_object":
        return {"json_object": True}
    return {"json": response_format["json_schema"]["schema"]}


def constraint_field(params) -> str:
    """The request field a constraint came from, for errors."""
    return SO_FIELD if params.structured_outputs is not None else FIELD


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

    def compile(self, constraint: dict, field: str = FIELD):
        """The compiled grammar of a constraint (`SamplingParams.constraint`); an unusable one raises
        InvalidRequestError naming `field`. Safe from any thread (the serving layer compiles off the
        event loop before submitting; xgrammar caches what it compiled)."""
        compiler = self._get_compiler()
        if "type" in constraint:  # a response_format as SamplingParams holds it
            constraint = response_format_constraint(constraint)
        (kind, spec), = constraint.items()
        try:
            if kind == "json_object":  # any JSON object (xgrammar's built-in JSON allows arrays)
                return compiler.compile_json_schema(JSON_OBJECT)
            if kind == "json":
                return compiler.compile_json_schema(json.dumps(spec))
            if kind == "regex":
                return compiler.compile_regex(spec)
            if kind == "choice":
                return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in spec))
            return compiler.compile_grammar(spec)
        except (RuntimeError, ValueError, TypeError) as exc:
            reason = _XGRAMMAR_PREFIX.sub("", str(exc)).strip().splitlines()[0]
            what = "JSON schema" if kind in ("json", "json_object") else kind
            raise InvalidRequestError(field, f"invalid {what}: {reason}") from None

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
