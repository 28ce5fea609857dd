"""CUDA graphs for decode-only steps: one graph per padded batch size, replayed over static input buffers.

A step of n decodes runs the graph of the smallest capture size >= n. The step's token ids, positions,
slot mapping, block tables and context lengths are copied into the static buffers; the padding rows write
no KV (slot -1) and attend over one token of the null block, and their output rows are ignored. A graph is
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
    """Replays captured decode forwards of `model`. Invariant: all graphs share one memory pool, so a
    replay's output is only valid until the next replay (the runner reads it at once)."""

    def __init__(self, model: torch.nn.Module, max_batch_size: int, max_blocks_per_seq: int,
                 device: torch.device):
        self.model = model
        self.sizes = capture_sizes(max_batch_size)
        largest = self.sizes[-1]
        self.input_ids = torch.zeros(largest, dtype=torch.int64, device=device)
        self.positions = torch.zeros(largest, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((largest,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(largest, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.context_lens = torch.ones(largest, dtype=torch.int32, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None

    def can_run(self, num_tokens: int, meta: AttentionMetadata) -> bool:
        """Decode-only steps that fit the largest graph and the static block table."""
        return (meta.num_decode_tokens == num_tokens <= self.sizes[-1]
                and meta.decode_block_tables.shape[1] <= self.block_tables.shape[1])

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The hidden states [n, hidden] of the step, as `model(input_ids, positions, [meta])` computes them."""
        n = input_ids.shape[0]
        size = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:size].fill_(-1)
        tables = meta.decode_block_tables
        self.block_tables[:n, :tables.shape[1]].copy_(tables)  # columns beyond a row's length are never read
        self.block_tables[n:size, 0].fill_(0)
        self.context_lens[:n].copy_(meta.decode_context_lens)
        self.context_lens[n:size].fill_(1)
        captured = self.graphs.get(size)
        if captured is None:
            captured = self.graphs[size] = self._capture(size)
        graph, output = captured
        graph.replay()
        return output[:n]

    def _capture(self, size: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], num_decode_tokens=size,
            decode_block_tables=self.block_tables[:size], decode_context_lens=self.context_lens[:size],
            prefill_block_tables=None, prefill_cu_seqlens_q=None, prefill_context_lens=None,
            max_prefill_query_len=0)
        args = (self.input_ids[:size], self.positions[:size], [meta])  # one KV-cache group
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
