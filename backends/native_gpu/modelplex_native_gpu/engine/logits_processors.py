"""Per-request logit edits before sampling: `logit_bias`, `allowed_token_ids`, `min_tokens` (EOS and
stop_token_ids masked until then) and `bad_words` (a word's last token masked once its other tokens are
the output's tail). Rows without any of them are untouched; the sampler calls this only when one has.
"""
from __future__ import annotations

import torch

from .request import EngineRequest


def bad_word_ids(tokenizer, words: list[str]) -> list[list[int]]:
    """Each bad word's token ids, as it reads alone and after a space (BPE tokenizes them differently)."""
    sequences = []
    for word in words:
        for variant in (word, " " + word.lstrip()):
            ids = tokenizer.encode(variant, add_special_tokens=False)
            if ids and ids not in sequences:
                sequences.append(ids)
    return sequences


def apply_logits_processors(logits: torch.Tensor, requests: list[EngineRequest]) -> None:
    """Edit `logits` [rows, vocab] in place, row i for requests[i]."""
    for row, request in enumerate(requests):
        params = request.sampling_params
        if not params.has_logits_processors:
            continue
        if params.allowed_token_ids is not None:
            keep = torch.full_like(logits[row], float("-inf"))
            ids = torch.tensor(params.allowed_token_ids, device=logits.device)
            keep[ids] = 0.0
            logits[row] += keep
        if params.logit_bias:
            ids = torch.tensor(list(params.logit_bias), device=logits.device)
            logits[row, ids] += torch.tensor(list(params.logit_bias.values()), device=logits.device,
                                             dtype=logits.dtype)
        banned = _banned_ids(request)
        if banned:
            logits[row, torch.tensor(banned, device=logits.device)] = float("-inf")


def _banned_ids(request: EngineRequest) -> list[int]:
    params = request.sampling_params
    banned = []
    if request.num_output_tokens < params.min_tokens:
        banned += params.stop_token_ids
        if request.eos_token_id is not None:
            banned.append(request.eos_token_id)
    output = request.output_token_ids
    for sequence in request.bad_words:
        prefix = sequence[:-1]
        if len(prefix) <= len(output) and (not prefix or output[len(output) - len(prefix):] == prefix):
            banned.append(sequence[-1])
    return banned
