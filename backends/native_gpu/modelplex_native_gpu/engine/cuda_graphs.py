"""CUDA graphs for decode-only steps: one graph per padded batch size, replayed over static input buffers.

A step of n decodes runs the graph of the smallest capture size >= n. The static inputs are the runner's
persistent StepInputs device buffers (token ids, positions, slot mapping, block tables, context lengths),
which one host-to-device copy fills, padding rows included: nothing is copied again for the replay. The
padding rows write no KV (slot -1) and attend over one token of the null block; their outputs are ignored. A graph is
captured the first time its size is needed, after an eager run of the same inputs (which compiles the
Triton kernels and picks the cuBLAS algorithms; it writes the same K/V the replay then writes again).
"""
from __future__ import annotations

import torch

from ..layers.attention import AttentionMetadata

MAX_CAPTURE_SIZE = 256


def capture_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, then every multiple of 8 up to the first that holds `max_batch_size` (at most 256)."""
    limit = min(max_batch_size, MAX_CAPTURE_SIZE)
    sizes = [s for s in (1, 2, 4) if s < limit]
    size = 8
    while size < limit:
        sizes.append(size)
        size += 8
    return sizes + [size if limit > 4 else limit]


class CudaGraphRunner:
    """Replays captured decode forwards of `model` over `buffers` (the runner's StepInputs device views,
    which the runner fills, padding included, before each replay). Invariant: all graphs share one memory
    pool, so a replay's output is only valid until the next replay (the runner reads it at once)."""

    def __init__(self, model: torch.nn.Module, max_batch_size: int, buffers: dict[str, torch.Tensor]):
        self.model = model
        self.sizes = capture_sizes(max_batch_size)
        self.buffers = buffers
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None

    def padded_size(self, num_decodes: int) -> int | None:
        """The capture size a decode-only step of `num_decodes` rows runs at; None when none holds it."""
        if num_decodes > self.sizes[-1]:
            return None
        return next(s for s in self.sizes if s >= num_decodes)

    def run(self, num_decodes: int, size: int) -> torch.Tensor:
        """The hidden states [num_decodes, hidden] of the step, as the model computes them eagerly."""
        captured = self.graphs.get(size)
        if captured is None:
            captured = self.graphs[size] = self._capture(size)
        graph, output = captured
        graph.replay()
        return output[:num_decodes]

    def _capture(self, size: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        b = self.buffers
        meta = AttentionMetadata(
            slot_mapping=b["slot_mapping"][:size], num_decode_tokens=size,
            decode_block_tables=b["block_tables"][:size], decode_context_lens=b["context_lens"][:size],
            prefill_block_tables=None, prefill_cu_seqlens_q=None, prefill_context_lens=None,
            max_prefill_query_len=0)
        args = (b["input_ids"][:size], b["positions"][:size], [meta])  # one KV-cache group
        side = torch.cuda.Stream()  # warm-up on a side stream, as torch.cuda.graph asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.model.forward(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = self.model.forward(*args)
        if self.pool is None:
            self.pool = graph.pool()
        return graph, output
