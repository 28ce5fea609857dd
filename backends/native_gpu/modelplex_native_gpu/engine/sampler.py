"""Sampler: turns a batch of logits into one token per row, honouring each request's SamplingParams.

All-greedy batches without penalties or logprobs take a single argmax. Otherwise penalties,
temperature, top-k, top-p and min-p are applied batched; random rows draw by the exponential
race (argmax p / q, q ~ Exp(1)), using the request's own generator when it has a seed so its
output does not depend on what else is in the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .logits_processors import apply_logits_processors
from .request import EngineRequest
from .structured_output import accept_tokens, apply_grammar_masks


@dataclass
class SamplerOutput:
    """Aligned with the step's requests; None where the request did not sample this step."""

    token_ids: list[int | None]
    logprobs: list[dict[int, float] | None]

    @classmethod
    def empty(cls, n: int) -> SamplerOutput:
        return cls([None] * n, [None] * n)


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0, argmax_rows=None):
        """`argmax_rows`: fp32 logits [S, V] (contiguous rows) -> ids [S] as torch.argmax(dim=-1) gives them,
        in parallel over the rows (the compiled CPU op)."""
        self.device = device
        self._argmax_rows = argmax_rows
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def sample(self, logits: torch.Tensor, requests: list[EngineRequest], indices: list[int],
               num_requests: int) -> SamplerOutput:
        """logits [S, V] fp32 for `requests`, which sit at `indices` among the step's `num_requests`."""
        params = [r.sampling_params for r in requests]
        want_logprobs = any(p.logprobs is not None for p in params)
        if any(p.has_logits_processors for p in params):
            apply_logits_processors(logits, requests)
        apply_grammar_masks(logits, requests)
        if all(p.is_greedy and not p.has_penalties for p in params) and not want_logprobs:
            tokens = self._greedy(logits).tolist()
        else:
            raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
            if any(p.has_penalties for p in params):
                logits = apply_penalties(logits, requests)
            tokens = self._sample_processed(logits, requests)
        accept_tokens(requests, tokens)
        result = SamplerOutput.empty(num_requests)
        for row, (i, token) in enumerate(zip(indices, tokens)):
            result.token_ids[i] = token
            if params[row].logprobs is not None:
                result.logprobs[i] = top_logprobs(raw_logprobs[row], token, params[row].logprobs)
        return result

    def sample_on_device(self, logits: torch.Tensor, requests: list[EngineRequest]) -> torch.Tensor | None:
        """The sampled ids [S] as a device tensor (nothing waits for the device), for rows that need no
        logprobs, penalties, logits processors or grammar; None when some row does (`sample` then does it all)."""
        is_greedy = self.device_plan(requests)
        return None if is_greedy is None else self.sample_planned(logits, requests, is_greedy)

    @staticmethod
    def device_plan(requests: list[EngineRequest]) -> bool | None:
        """None when some row needs `sample` (logprobs, penalties, logits processors, grammar); else whether
        every row is greedy. (The runner asks before the forward, while the requests are in the CPU's caches.)"""
        is_greedy = True
        for r in requests:
            if not r.has_plain_sampling or r.grammar is not None:
                return None
            is_greedy = is_greedy and r.sampling_params.is_greedy
        return is_greedy

    def sample_planned(self, logits: torch.Tensor, requests: list[EngineRequest], is_greedy: bool) -> torch.Tensor:
        """sample_on_device for rows whose device_plan was `is_greedy` (not None)."""
        return self._greedy(logits) if is_greedy else self._sample_tensor(logits, requests)

    def _greedy(self, logits: torch.Tensor) -> torch.Tensor:
        if self._argmax_rows is not None and logits.dtype == torch.float32 and logits.stride(-1) == 1:
            return self._argmax_rows(logits)
        return logits.argmax(dim=-1)

    def _sample_processed(self, logits: torch.Tensor, requests: list[EngineRequest]) -> list[int]:
        return self._sample_tensor(logits, requests).tolist()

    def _sample_tensor(self, logits: torch.Tensor, requests: list[EngineRequest]) -> torch.Tensor:
        params = [r.sampling_params for r in requests]
        greedy = logits.argmax(dim=-1)
        random_rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if not random_rows:
            return greedy
        sub = logits[random_rows] / torch.tensor([params[i].temperature for i in random_rows],
                                                 device=logits.device)[:, None]
        sorted_logits, sorted_ids = sub.sort(dim=-1, descending=True)
        sorted_logits = mask_sorted_logits(sorted_logits, [params[i] for i in random_rows])
        probs = sorted_logits.softmax(dim=-1)
        noise = torch.empty_like(probs)
        for row, i in enumerate(random_rows):
            noise[row].exponential_(generator=self._generator_for(requests[i]))
        choice = (probs / noise).argmax(dim=-1, keepdim=True)
        sampled = sorted_ids.gather(1, choice).squeeze(1)
        greedy[random_rows] = sampled
        return greedy

    def _generator_for(self, request: EngineRequest) -> torch.Generator:
        seed = request.sampling_params.seed
        if seed is None:
            return self.generator
        if request.generator is None:
            request.generator = torch.Generator(device=self.device).manual_seed(seed)
        return request.generator


def mask_sorted_logits(sorted_logits: torch.Tensor, params: list) -> torch.Tensor:
    """Top-k, top-p and min-p on logits sorted descending per row; the top token always survives."""
    num_rows, vocab = sorted_logits.shape
    dev = sorted_logits.device
    ranks = torch.arange(vocab, device=dev)[None, :]
    top_k = torch.tensor([p.top_k or vocab for p in params], device=dev)[:, None]
    remove = ranks >= top_k
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
    top_p = torch.tensor([p.top_p for p in params], device=dev)[:, None]
    remove |= (probs.cumsum(dim=-1) - probs) > top_p  # mass before this token already reaches top_p
    min_p = torch.tensor([p.min_p for p in params], device=dev)[:, None]
    remove |= probs < min_p * probs[:, :1]
    remove[:, 0] = False
    return sorted_logits.masked_fill(remove, float("-inf"))


def apply_penalties(logits: torch.Tensor, requests: list[EngineRequest]) -> torch.Tensor:
    """Repetition penalty (HF: prompt + output tokens) and presence/frequency penalties (OpenAI: output)."""
    logits = logits.clone()
    vocab = logits.shape[1]
    for row, request in enumerate(requests):
        p = request.sampling_params
        if not p.has_penalties:
            continue
        if p.repetition_penalty != 1:
            seen = torch.tensor(sorted(set(request.all_token_ids)), device=logits.device)
            picked = logits[row, seen]
            logits[row, seen] = torch.where(picked > 0, picked / p.repetition_penalty, picked * p.repetition_penalty)
        if request.num_output_tokens and (p.presence_penalty or p.frequency_penalty):
            counts = torch.bincount(torch.tensor(request.output_token_ids, device=logits.device), minlength=vocab)
            logits[row] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
    return logits


def top_logprobs(logprobs: torch.Tensor, token: int, k: int) -> dict[int, float]:
    """The sampled token's log-probability plus the k most likely tokens'."""
    result = {token: float(logprobs[token])}
    if k:
        values, ids = logprobs.topk(k)
        result.update(zip(ids.tolist(), values.tolist()))
    return result
