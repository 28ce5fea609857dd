"""ModelRunner: owns the model and the KV cache tensors; turns a SchedulerOutput into one forward pass.

The step's tokens are flattened without padding (decodes first), with positions and slot_mapping
computed from the block tables. The runner decides nothing: it runs what the scheduler chose. A model with
one KV-cache group runs over persistent step inputs (engine/step_inputs.py), with CUDA graphs and async
scheduling; one with several (sliding windows) builds each group's AttentionMetadata per step and runs eagerly.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InvalidConfigError
from ..layers import quantized_triton
from ..layers.attention import AttentionMetadata
from ..layers.linear import Linear, can_pack
from ..layers.norm import RMSNorm
from ..loader import LoadedWeights
from ..models import model_class
from .cuda_graphs import CudaGraphRunner, capture_sizes
from .huge_pages import zeros_on_huge_pages
from .kv_cache_groups import group_layers, group_size
from .prompt_logprobs import record_prompt_logprobs, wants_prompt_logprobs
from .sampler import Sampler, SamplerOutput
from .scheduler import SchedulerOutput
from .step_inputs import StepInputs

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelRunnerConfig:
    device: str
    dtype: str
    block_size: int
    max_model_len: int
    cuda_graphs: bool = False  # decode-only steps replay captured CUDA graphs (CUDA only)
    max_num_seqs: int = 128  # the largest decode batch a graph is captured for
    max_num_batched_tokens: int = 2048  # the most tokens a step runs
    quantized_weights: bool = True  # a GGUF's quantized tensors stay in their blocks (CPU: compiled ops; CUDA)


class ModelRunner:
    def __init__(self, cfg: ModelRunnerConfig, loaded: LoadedWeights):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.dtype = _DTYPES[cfg.dtype]
        self.arch = loaded.config
        self.block_size = cfg.block_size
        if self.device.type == "cuda":
            from ..kernels import triton_attention as kernels
        else:
            from ..kernels import cpu as kernels

            kernels.compiled_ops()  # built (first use on this machine: ~15 s) while the model loads
        if loaded.is_quantized and not (cfg.quantized_weights and self._has_quantized_kernels(kernels)):
            loaded = loaded.dequantized()
        self.kernels = kernels
        self.model = model_class(loaded.config.family)(loaded.config, kernels, max_position=cfg.max_model_len)
        self.kv_groups = group_layers(loaded.config.window_of)
        for g, group in enumerate(self.kv_groups):
            for i in group.layer_ids:
                self.model.layers[i].kv_group = g
        # Parameters take the engine's dtype before the weights arrive (their fp32 allocation is never
        # touched): a bf16 checkpoint is copied once, not through an fp32 model.
        self.model.to(dtype=self.dtype)
        unused = self.model.load_weights(loaded.weights)
        if unused:
            logger.warning("ignored %d checkpoint tensors, e.g. %s", len(unused), unused[0])
        self.model.to(device=self.device, dtype=self.dtype)
        if self.device.type == "cuda":
            quantized_triton.to_device(self.model, self.device)  # the blocks read on the host, as planes
        self.model.eval()
        if can_pack(self.device, self.dtype):
            # fp32 (and bf16 where built) weights go into the compiled ops' panels (None without a compiler:
            # oneDNN's layout then)
            self.model.pack_linear_weights(batch_size_hint=64, cpu_ops=kernels.compiled_ops())
        if self.device.type == "cpu" and self.dtype in (torch.float32, torch.bfloat16):
            self.model.fused_ops = kernels.compiled_ops()  # None without a compiler: torch ops then
        ops = kernels.compiled_ops() if self.device.type == "cpu" else None
        self.sampler = Sampler(self.device, argmax_rows=ops.argmax_rows if ops is not None else None)
        self.kv_cache: torch.Tensor | None = None
        self.num_blocks = 0
        self.lora = None  # engine.lora.EngineLoRA when LoRA is on; it sets each step's token -> slot mapping
        max_rows = max(cfg.max_num_seqs, capture_sizes(cfg.max_num_seqs)[-1])  # a padded graph batch included
        self.inputs = StepInputs(max(cfg.max_num_batched_tokens, max_rows), max_rows,
                                 -(-cfg.max_model_len // self.block_size), self.device)
        self._previous = None  # the last step's sampled ids on the device and the requests of their rows
        self._sampled_host, self._sampled_parity = [], 0
        if self.device.type == "cuda":
            self._sampled_host = [torch.zeros(max_rows, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self.graphs = None
        if cfg.cuda_graphs and self.device.type == "cuda" and len(self.kv_groups) == 1:
            self.graphs = CudaGraphRunner(self.model, cfg.max_num_seqs, self.inputs.device_views)

    def _has_quantized_kernels(self, kernels) -> bool:
        """The compiled CPU ops (layers/quantized.py), or on CUDA the Triton kernel (layers/quantized_triton.py)."""
        if self.device.type == "cuda":
            return quantized_triton.available()
        return self.device.type == "cpu" and kernels.compiled_ops() is not None

    @property
    def bytes_per_block(self) -> int:
        a = self.arch
        slots = group_size(self.kv_groups)  # a block holds one group's layers
        return 2 * slots * self.block_size * a.num_key_value_heads * a.head_dim * self.dtype.itemsize

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights a decode step reads: each linear's (its packed copy where packed), the
        norms'; the embedding only as a tied LM head (a step reads a few of its rows otherwise)."""
        tensors = {}
        for module in self.model.modules():
            if isinstance(module, Linear):
                tensors.update((id(t), t) for t in module.weight_tensors())
            elif isinstance(module, RMSNorm):
                tensors[id(module.weight)] = module.weight
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def allocate_kv_cache(self, memory_bytes: int) -> int:
        """Allocate as many blocks as fit in `memory_bytes` (block 0 is the null block); every KV-cache
        group draws from them."""
        num_blocks = memory_bytes // self.bytes_per_block
        needed = len(self.kv_groups) * -(-self.cfg.max_model_len // self.block_size) + 1
        if num_blocks < needed:
            raise InvalidConfigError(
                "kv_cache_memory_bytes",
                f"{memory_bytes} bytes hold {num_blocks} blocks but one sequence of max_model_len="
                f"{self.cfg.max_model_len} needs {needed} blocks: at least {needed * self.bytes_per_block} bytes "
                f"(or lower max_model_len)")
        a = self.arch
        # Head-major on CPU so the torch path gathers [Hkv, N, D] matrices; token-major for the Triton kernels.
        head_major = self.device.type == "cpu"
        shape = (a.num_key_value_heads, num_blocks, self.block_size) if head_major else \
            (num_blocks, self.block_size, a.num_key_value_heads)
        slots = group_size(self.kv_groups)
        if head_major:  # scattered block reads: huge pages spare most TLB misses (engine/huge_pages.py)
            self.kv_cache = zeros_on_huge_pages((2, slots, *shape, a.head_dim), self.dtype)
        else:
            self.kv_cache = torch.zeros(2, slots, *shape, a.head_dim, dtype=self.dtype, device=self.device)
        if head_major:
            self.kv_cache = self.kv_cache.permute(0, 1, 3, 4, 2, 5)  # same [.., num_blocks, block_size, Hkv, D] view
        for group in self.kv_groups:  # layer j of every group shares cache slot j (each group its own blocks)
            for slot, i in enumerate(group.layer_ids):
                self.model.layers[i].self_attn.attn.k_cache = self.kv_cache[0, slot]
                self.model.layers[i].self_attn.attn.v_cache = self.kv_cache[1, slot]
        self.num_blocks = num_blocks
        return num_blocks

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> StepOutput:
        """Launch one step; the sampled tokens (one for each request whose scheduled tokens reach its end) are
        read from the returned StepOutput, which on CUDA may wait for the device. Tokens that were still on
        the device (`num_output_placeholders`) are taken from the previous step's sampled ids.

        A model with one KV-cache group runs over the persistent step inputs, decode-only steps replaying CUDA
        graphs; one with several (sliding windows) builds one AttentionMetadata per group and runs eagerly (its
        graphs would need a block table per group), and the engine steps it synchronously."""
        order, num_decodes = self._order(out)
        if self.lora is not None:  # the mapping follows the flattened rows
            self.lora.set_step([out.requests[i] for i in order], [out.num_scheduled_tokens[i] for i in order])
        graph_size = None
        if len(self.kv_groups) > 1:
            input_ids, positions, metas, sample_rows, sample_indices = self._prepare_groups(out, order, num_decodes)
        else:
            # A graph captured without adapters skips the LoRA ops: steps with an adapter run eagerly.
            if self.graphs is not None and num_decodes == len(order) and (
                    self.lora is None or self.lora.model.context.mapping is None):
                graph_size = self.graphs.padded_size(num_decodes)
            input_ids, positions, meta, sample_rows, sample_indices = self._prepare(out, order, num_decodes,
                                                                                    graph_size)
            metas = [meta]
        wants_logprobs = wants_prompt_logprobs(out)
        if not wants_logprobs and graph_size is None and len(metas) == 1:
            metas[0].sample_rows = sample_rows  # prompt logprobs read every row
        # Decided before the forward, which evicts the requests from the CPU's caches.
        requests = [out.requests[i] for i in sample_indices]
        plan = self.sampler.device_plan(requests)
        if graph_size is not None:
            hidden = self.graphs.run(num_decodes, graph_size)
        else:
            hidden = self.model(input_ids, positions, metas)
        if wants_logprobs:  # prefill rows, in `order` (a graph's padding rows come after them)
            record_prompt_logprobs(self.model, hidden, out, order)
        if not sample_indices:
            self._previous = None
            return StepOutput(len(out.requests), [], None)
        if len(sample_indices) < hidden.shape[0]:  # the model returned every row
            hidden = hidden[sample_rows]
        return self._sample(self.model.compute_logits(hidden), out, sample_indices, requests, plan)

    def _sample(self, logits: torch.Tensor, out: SchedulerOutput, sample_indices: list[int],
                requests: list, is_greedy: bool | None) -> StepOutput:
        """Plain rows (no logprobs, penalties or grammar; `is_greedy` not None) stay on the device: greedy ones
        by one argmax, and one small copy into pinned memory brings the ids back; other steps take the
        sampler's full path."""
        if is_greedy is None:  # the full path: host lists
            sampled = self.sampler.sample(logits, requests, sample_indices, len(out.requests))
            self._previous = None
            return StepOutput(len(out.requests), sample_indices, None, sampled)
        token_ids = self.sampler.sample_planned(logits, requests, is_greedy)
        self._previous = (token_ids, requests)
        if self.device.type == "cuda":  # two buffers: this step's ids may land before the last step's are read
            self._sampled_parity ^= 1
            host = self._sampled_host[self._sampled_parity][:len(requests)]
            host.copy_(token_ids, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            return StepOutput(len(out.requests), sample_indices, host, ready=done)
        return StepOutput(len(out.requests), sample_indices, token_ids)

    @staticmethod
    def _order(out: SchedulerOutput) -> tuple[list[int], int]:
        """One-token rows (decodes) first, longest context first so the CPU decode path gathers sequences of
        similar length together; then the prefill chunks in scheduling order."""
        decodes = sorted((i for i, n in enumerate(out.num_scheduled_tokens) if n == 1),
                         key=lambda i: -out.requests[i].num_computed_tokens)
        return decodes + [i for i, n in enumerate(out.num_scheduled_tokens) if n != 1], len(decodes)

    def _rows(self, out: SchedulerOutput, order: list[int], write_tables: bool):
        """The flattened step's token ids (0 for a token still on the device), each row's start and length,
        the rows that sample and their requests' indices, and for each token still on the device its index in
        the token ids (dst) and its row in the previous step's sampled ids (src). With `write_tables`, each
        row's block table (of the one KV-cache group) goes into the persistent inputs."""
        write = self.inputs.write_block_table if write_tables else None
        input_ids, starts, lens, sample_rows, sample_indices, dst, src = [], [], [], [], [], [], []
        previous_rows = None  # request id -> its row in the previous step's sampled ids, built when needed
        requests, num_scheduled, block_tables = out.requests, out.num_scheduled_tokens, out.block_tables
        for row, i in enumerate(order):
            request, n = requests[i], num_scheduled[i]
            start = request.num_computed_tokens
            known = request.all_token_ids[start:start + n]
            if len(known) < n:  # the last token was sampled by the step still in flight
                if previous_rows is None:
                    previous_rows = {r.request_id: k for k, r in enumerate(self._previous[1])}
                dst.append(len(input_ids) + len(known))
                src.append(previous_rows[request.request_id])
                known.append(0)
            input_ids += known
            starts.append(start)
            lens.append(n)
            if start + n >= request.num_tokens + request.num_output_placeholders:
                sample_rows.append(len(input_ids) - 1)
                sample_indices.append(i)
            if write is not None:
                write(row, request, block_tables[i][0])
        return input_ids, starts, lens, sample_rows, sample_indices, dst, src

    def _prepare(self, out: SchedulerOutput, order: list[int], nd: int, graph_size: int | None):
        """One KV-cache group: fill the persistent inputs for the flattened step (rows in `order`, `nd`
        decodes first), padded to `graph_size` rows for a CUDA graph, and send them in one copy."""
        bs, inputs = self.block_size, self.inputs
        host = inputs.begin_step()
        input_ids, starts, lens, sample_rows, sample_indices, dst, src = self._rows(out, order, True)
        rows, num_tokens = len(order), len(input_ids)
        padded = graph_size or rows
        if padded > rows:
            inputs.clear_rows(rows, padded)
        host["input_ids"][:num_tokens] = input_ids
        if nd == rows:  # decodes only: one token per row, at its start (longest first); a few Python
            # lists cost less host time here than numpy's per-call overhead on 64 rows
            tables = [out.block_tables[i][0] for i in order]
            host["positions"][:rows] = starts
            host["slot_mapping"][:rows] = [t[p // bs] * bs + p % bs for t, p in zip(tables, starts)]
            host["context_lens"][:rows] = [p + 1 for p in starts]
            max_blocks = -(-(starts[0] + 1) // bs)
        else:
            starts_np, lens_np = np.array(starts, dtype=np.int64), np.array(lens, dtype=np.int64)
            req_index = np.repeat(np.arange(rows), lens_np)
            cu = np.zeros(rows + 1, dtype=np.int64)
            np.cumsum(lens_np, out=cu[1:])
            positions = np.arange(num_tokens) - cu[req_index] + starts_np[req_index]
            host["cu_seqlens"][:rows - nd + 1] = cu[nd:] - cu[nd]
            host["positions"][:num_tokens] = positions
            host["slot_mapping"][:num_tokens] = host["block_tables"][req_index, positions // bs] * bs + positions % bs
            host["context_lens"][:rows] = starts_np + lens_np
            max_blocks = -(-int(host["context_lens"][:rows].max()) // bs)
        if padded > rows:  # padding rows write no KV and attend over one token of the null block
            host["input_ids"][rows:padded] = 0
            host["positions"][rows:padded] = 0
            host["slot_mapping"][rows:padded] = -1
            host["context_lens"][rows:padded] = 1
        host["sample_rows"][:len(sample_rows)] = sample_rows
        if dst:
            host["token_dst"][:len(dst)] = dst
            host["token_src"][:len(src)] = src
        inputs.copy_to_device(padded)
        view = inputs.view
        if dst:  # tokens still on the device go from the previous step's ids into this step's input ids
            ids = self._previous[0].index_select(0, view("token_src", 0, len(src)))
            inputs.device_views["input_ids"].index_copy_(0, view("token_dst", 0, len(dst)), ids)
        num_padded_tokens = num_tokens + padded - rows
        decode_tables = decode_lens = plan = None
        if nd:
            # Decode attention reads max_decode_blocks blocks per sequence: trim the padding prefills add.
            max_decode_blocks = -(-(starts[0] + 1) // bs)
            decode_tables = view("block_tables", 0, padded if nd == rows else nd, max_decode_blocks)
            decode_lens = view("context_lens", 0, padded if nd == rows else nd)
            plan = self.kernels.plan_decode(decode_tables, decode_lens, bs)
        meta = AttentionMetadata(
            slot_mapping=view("slot_mapping", 0, num_padded_tokens), num_decode_tokens=nd if nd < rows else padded,
            decode_block_tables=decode_tables, decode_context_lens=decode_lens,
            prefill_block_tables=view("block_tables", nd, rows, max_blocks),
            prefill_cu_seqlens_q=view("cu_seqlens", 0, rows - nd + 1),
            prefill_context_lens=view("context_lens", nd, rows),
            max_prefill_query_len=max(lens[nd:], default=0), decode_plan=plan)
        return (view("input_ids", 0, num_padded_tokens), view("positions", 0, num_padded_tokens), meta,
                view("sample_rows", 0, len(sample_rows)), sample_indices)

    def _prepare_groups(self, out: SchedulerOutput, order: list[int], nd: int):
        """Several KV-cache groups: the flattened step's tensors and one AttentionMetadata per group (rows in
        `order`, `nd` decodes first)."""
        dev = self.device
        input_ids, starts, lens, sample_rows, sample_indices, dst, src = self._rows(out, order, False)
        lens_t, starts_t = torch.tensor(lens), torch.tensor(starts)
        req_index = torch.repeat_interleave(torch.arange(len(lens)), lens_t)
        cu = torch.zeros(len(lens) + 1, dtype=torch.int64)
        torch.cumsum(lens_t, 0, out=cu[1:])
        positions = torch.arange(len(input_ids)) - cu[req_index] + starts_t[req_index]
        context_lens = (starts_t + lens_t).to(torch.int32)
        step = (positions, req_index, cu, context_lens, lens, starts, nd)
        metas = [self._group_meta([out.block_tables[i][g] for i in order], step) for g in range(len(self.kv_groups))]
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        if dst:  # the engine steps these models synchronously, so only if that changes
            ids[torch.tensor(dst, device=dev)] = self._previous[0][torch.tensor(src, device=dev)]
        return ids, positions.to(dev), metas, torch.tensor(sample_rows, device=dev), sample_indices

    def _group_meta(self, block_tables: list[list[int]], step) -> AttentionMetadata:
        """One KV-cache group's view of the step: its block tables and the slots its layers write."""
        positions, req_index, cu, context_lens, lens, starts, nd = step
        bs, dev = self.block_size, self.device
        max_blocks = max(len(t) for t in block_tables)
        tables = torch.tensor([t + [0] * (max_blocks - len(t)) for t in block_tables], dtype=torch.int32)
        slot_mapping = tables[req_index, positions // bs].long() * bs + positions % bs
        decode_tables = decode_lens = plan = None
        if nd:
            # Decode attention reads max_decode_blocks blocks per sequence: trim the padding prefills add.
            max_decode_blocks = -(-(starts[0] + 1) // bs)
            decode_tables, decode_lens = tables[:nd, :max_decode_blocks].to(dev), context_lens[:nd].to(dev)
            plan = self.kernels.plan_decode(decode_tables, decode_lens, bs)
        return AttentionMetadata(
            slot_mapping=slot_mapping.to(dev), num_decode_tokens=nd,
            decode_block_tables=decode_tables, decode_context_lens=decode_lens,
            prefill_block_tables=tables[nd:].to(dev),
            prefill_cu_seqlens_q=(cu[nd:] - cu[nd]).to(torch.int32).to(dev),
            prefill_context_lens=context_lens[nd:].to(dev),
            max_prefill_query_len=max(lens[nd:], default=0), decode_plan=plan)


class StepOutput:
    """One step's sampled tokens, aligned with the step's requests (None where a request did not sample).
    On CUDA the ids arrive in pinned memory; `result()` waits for them once."""

    def __init__(self, num_requests: int, sample_indices: list[int], ids: torch.Tensor | None,
                 sampled: SamplerOutput | None = None, ready=None):
        self.num_requests, self.sample_indices, self._ids, self._ready = num_requests, sample_indices, ids, ready
        self._sampled = sampled

    def result(self) -> SamplerOutput:
        if self._sampled is None:
            if self._ready is not None:
                self._ready.synchronize()
            result = SamplerOutput.empty(self.num_requests)
            if self._ids is not None:
                for i, token in zip(self.sample_indices, self._ids.tolist()):
                    result.token_ids[i] = token
            self._sampled = result
        return self._sampled
