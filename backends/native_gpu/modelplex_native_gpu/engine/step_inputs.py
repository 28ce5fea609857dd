"""StepInputs: the runner's persistent input buffers, filled in place each step and sent in one copy.

Every per-step input (token ids, positions, slot mapping, the rows that sample, where the previous step's
sampled ids go, context lengths, cu_seqlens, block tables) is a fixed view into one host byte buffer and the
same view into one device byte buffer, so a step writes numpy views of the host buffer (no tensors built)
and moves them with a single host-to-device copy (pinned memory, non_blocking). The device views are also
the CUDA graphs' static inputs: a replay reads them where the copy put them. On CPU the host buffer is the
device buffer and nothing is copied. Block tables are last in the layout, so the copy stops after the rows
in use; a row is rewritten only where its request's blocks changed (new blocks are appended in place).
"""
from __future__ import annotations

import numpy as np
import torch

_FIELDS = (  # name, dtype, length in units of (tokens, rows): the order of the byte layout
    ("input_ids", torch.int64, (1, 0)),
    ("positions", torch.int64, (1, 0)),
    ("slot_mapping", torch.int64, (1, 0)),
    ("sample_rows", torch.int64, (0, 1)),
    ("token_dst", torch.int64, (0, 1)),  # input_ids rows whose token is still on the device (async scheduling)
    ("token_src", torch.int64, (0, 1)),  # ... and their rows in the previous step's sampled ids
    ("context_lens", torch.int32, (0, 1)),
    ("cu_seqlens", torch.int32, (0, 1)),  # one more than rows: allocated as rows + 1 below
)


class StepInputs:
    """Invariant: `host[name]` (numpy) and `device[name]` (torch) view the same bytes of their buffers;
    what a step wrote into the host views reaches the device views by `copy_to_device`."""

    def __init__(self, max_num_tokens: int, max_num_rows: int, max_blocks_per_seq: int, device: torch.device):
        self.device = device
        self.max_num_tokens, self.max_num_rows = max_num_tokens, max_num_rows
        self.max_blocks_per_seq = max_blocks_per_seq
        sizes, offset = {}, 0
        for name, dtype, (per_token, per_row) in _FIELDS:
            count = per_token * max_num_tokens + per_row * max_num_rows + (name == "cu_seqlens")
            sizes[name] = (offset, count, dtype)
            offset += -(-count * dtype.itemsize // 8) * 8
        self._tables_offset = offset
        total = offset + max_num_rows * max_blocks_per_seq * 4
        on_cuda = device.type == "cuda"
        self._host_bytes = torch.zeros(total, dtype=torch.uint8, pin_memory=on_cuda)
        self._device_bytes = torch.zeros(total, dtype=torch.uint8, device=device) if on_cuda else self._host_bytes
        self._copied = torch.cuda.Event() if on_cuda else None  # recorded after each copy
        self._copy_pending = False
        self.device_views = self._views(self._device_bytes, sizes)
        self.host = {name: t.numpy() for name, t in self._views(self._host_bytes, sizes).items()}
        # The request whose blocks each table row holds (identity, preemption count, blocks written).
        self._row_owner: list = [None] * max_num_rows
        self._row_state: list[tuple[int, int]] = [(0, 0)] * max_num_rows
        self._slices: dict[tuple, torch.Tensor] = {}  # view() results: steps of one shape reuse them

    def _views(self, buffer: torch.Tensor, sizes: dict) -> dict[str, torch.Tensor]:
        views = {name: buffer[offset:offset + count * dtype.itemsize].view(dtype)
                 for name, (offset, count, dtype) in sizes.items()}
        views["block_tables"] = buffer[self._tables_offset:].view(torch.int32).view(
            self.max_num_rows, self.max_blocks_per_seq)
        return views

    def view(self, name: str, start: int, end: int, num_cols: int | None = None) -> torch.Tensor:
        """device_views[name][start:end] (block tables: [start:end, :num_cols]); a torch slice costs more
        host time than the lookup, and decode steps ask for the same few shapes step after step."""
        key = (name, start, end, num_cols)
        view = self._slices.get(key)
        if view is None:
            if len(self._slices) >= 256:  # prefill steps' shapes vary: keep the cache small
                self._slices.clear()
            full = self.device_views[name]
            view = self._slices[key] = full[start:end] if num_cols is None else full[start:end, :num_cols]
        return view

    def begin_step(self) -> dict[str, np.ndarray]:
        """The host views, free to fill: the previous step's copy has left the buffer. (With async scheduling
        that copy was queued behind a step the engine has already waited for, so this rarely waits.)"""
        if self._copy_pending:
            self._copied.synchronize()
            self._copy_pending = False
        return self.host

    def write_block_table(self, row: int, request, table: list[int]) -> None:
        """Row `row` of the block tables holds `table`; only blocks the row lacks are written. (Where a sliding
        window handed leading blocks back, the row keeps their old ids: attention masks those positions.)"""
        bt = self.host["block_tables"]
        state = (request.num_preemptions, len(table))
        if self._row_owner[row] is request and self._row_state[row][0] == state[0]:
            written = self._row_state[row][1]
            if written < state[1]:
                bt[row, written:state[1]] = table[written:]
        else:
            bt[row, :state[1]] = table
            self._row_owner[row] = request
        self._row_state[row] = state

    def clear_rows(self, start: int, end: int) -> None:
        """Rows [start, end) become padding: block 0 (the null block), owned by no request."""
        self.host["block_tables"][start:end, 0] = 0
        for row in range(start, end):
            self._row_owner[row] = None

    def copy_to_device(self, num_rows: int) -> None:
        """Send what this step wrote (block-table rows up to `num_rows`) to the device views."""
        if self._copied is None:
            return
        end = self._tables_offset + num_rows * self.max_blocks_per_seq * 4
        self._device_bytes[:end].copy_(self._host_bytes[:end], non_blocking=True)
        self._copied.record()
        self._copy_pending = True
