"""Prompt log-probabilities (`prompt_logprobs`): while a request's prompt is prefilled, the logits of
its prompt rows give the log-probability of each next prompt token (vLLM's shape: position 0 has none).

The runner lays a step's rows out in `order` (each request's scheduled tokens contiguous); a row at
position p predicts the token at p + 1. A request asking for them never hits the prefix cache (the
engine salts its block hashes), so every prompt position is computed here, once (a recomputation after
preemption is skipped).
"""
from __future__ import annotations

import torch

from .scheduler import SchedulerOutput


def wants_prompt_logprobs(out: SchedulerOutput) -> bool:
    return any(r.prompt_logprobs is not None and r.num_computed_tokens < r.num_prompt_tokens - 1
               for r in out.requests)


def record_prompt_logprobs(model, hidden: torch.Tensor, out: SchedulerOutput, order: list[int]) -> None:
    """Append the step's prompt logprobs to each asking request (`EngineRequest.prompt_logprobs`)."""
    row = 0
    for i in order:
        request, num_rows = out.requests[i], out.num_scheduled_tokens[i]
        first, start = row, request.num_computed_tokens
        row += num_rows
        found = request.prompt_logprobs
        if found is None:
            continue
        # positions start .. end-1 predict prompt tokens start+1 .. end; only those not yet recorded
        end = min(start + num_rows, request.num_prompt_tokens - 1)
        begin = max(start, len(found))
        if begin >= end:
            continue
        logprobs = torch.log_softmax(model.compute_logits(hidden[first + begin - start:first + end - start]), dim=-1)
        targets = torch.tensor(request.all_token_ids[begin + 1:end + 1], device=logprobs.device)
        chosen = logprobs.gather(1, targets[:, None]).squeeze(1).tolist()
        k = request.sampling_params.prompt_logprobs
        top_values, top_ids = logprobs.topk(k, dim=-1) if k else (None, None)
        for j, token in enumerate(targets.tolist()):
            entry = {token: chosen[j]}
            if k:
                entry.update(zip(top_ids[j].tolist(), top_values[j].tolist()))
            found.append(entry)
