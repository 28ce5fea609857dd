"""The hidden states an engine's model returns, step by step, for tests that read them."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def every_row_hidden_states(model) -> Iterator[list]:
    """Collects each step's forward output with every row of the step: the model is not told which rows
    sample (as at prompt logprobs), so a step with prefill rows returns them all, not only the sampled ones."""
    captured = []
    forward = model.forward

    def capture(input_ids, positions, metas):
        for meta in metas:
            meta.sample_rows = None
        captured.append(forward(input_ids, positions, metas))
        return captured[-1]
    model.forward = capture
    try:
        yield captured
    finally:
        del model.forward
