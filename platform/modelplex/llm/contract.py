"""The typed LLM contract between the doors, the data plane and a backend: `GenerateInputs` in (see
`tensor_protocol`), `TextChunk`s out. A backend implements `ModelInstance.generate`; the OpenAI routes
build their JSON from chunks, and the KServe tensor form is one adapter (`tensor_adapter`)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability and its most likely alternatives. `token_id` is None where the
    engine reports text only; `logprob` is None for a prompt's first token (nothing precedes it)."""

    token: str
    logprob: float | None
    token_id: int | None = None
    top: tuple[TokenLogprob, ...] = ()


@dataclass
class TextChunk:
    """What one completion (`index`) adds: a text delta, its token ids and, when asked for, their
    log-probabilities (one entry per token) and the prompt's (on the completion's first chunk). A
    completion's last chunk has `finish_reason`. Token counts are the completion's so far; `phases`
    are the engine's queue and prefill spans `(name, start ns, end ns, attributes)` for tracing."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    index: int = 0
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    phases: list[tuple[str, int, int, dict]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
