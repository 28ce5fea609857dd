"""ModelRunner: owns the model and the KV cache tensors; turns a SchedulerOutput into one forward pass.

The step's tokens are flattened without padding (decodes first), with positions and slot_mapping
computed from the block tables. The runner decides nothing: it runs what the scheduler chose.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..errors import InvalidConfigError
from ..layers.attention import AttentionMetadata
from ..layers.linear import Linear, can_pack
from ..layers.norm import RMSNorm
from ..loader import LoadedWeights
from ..models.llama import LlamaForCausalLM
from .cuda_graphs import CudaGraphRunner
from .sampler import Sampler, SamplerOutput
from .scheduler import SchedulerOutput

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
    quantized_weights: bool = True  # a GGUF's quantized tensors stay in their blocks (CPU with compiled ops)


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
        if loaded.is_quantized and not (cfg.quantized_weights and self.device.type == "cpu"
                                        and kernels.compiled_ops() is not None):
            loaded = loaded.dequantized()  # the quantized kernels are the compiled CPU ops
        self.kernels = kernels
        self.model = LlamaForCausalLM(loaded.config, kernels, max_position=cfg.max_model_len)
        unused = self.model.load_weights(loaded.weights)
        if unused:
            logger.warning("ignored %d checkpoint tensors, e.g. %s", len(unused), unused[0])
        self.model.to(device=self.device, dtype=self.dtype)
        self.model.eval()
        cpu_fp32 = self.device.type == "cpu" and self.dtype == torch.float32
        if can_pack(self.device, self.dtype):
            # fp32 weights go into the compiled ops' panels (None without a compiler: oneDNN's layout then)
            self.model.pack_linear_weights(batch_size_hint=64, cpu_ops=kernels.compiled_ops() if cpu_fp32 else None)
        if cpu_fp32:
            self.model.fused_ops = kernels.compiled_ops()  # None without a compiler: torch ops then
        self.sampler = Sampler(self.device)
        self.kv_cache: torch.Tensor | None = None
        self.num_blocks = 0
        self.lora = None  # engine.lora.EngineLoRA when LoRA is on; it sets each step's token -> slot mapping
        self.graphs = None
        if cfg.cuda_graphs and self.device.type == "cuda":
            self.graphs = CudaGraphRunner(self.model, cfg.max_num_seqs, -(-cfg.max_model_len // self.block_size),
                                          self.device)

    @property
    def bytes_per_block(self) -> int:
        a = self.arch
        return 2 * a.num_hidden_layers * self.block_size * a.num_key_value_heads * a.head_dim * self.dtype.itemsize

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
        """Allocate as many blocks as fit in `memory_bytes` (block 0 is the null block)."""
        num_blocks = memory_bytes // self.bytes_per_block
        needed = -(-self.cfg.max_model_len // self.block_size) + 1
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
        self.kv_cache = torch.zeros(2, a.num_hidden_layers, *shape, a.head_dim, dtype=self.dtype, device=self.device)
        if head_major:
            self.kv_cache = self.kv_cache.permute(0, 1, 3, 4, 2, 5)  # same [.., num_blocks, block_size, Hkv, D] view
        for i, layer in enumerate(self.model.layers):
            layer.self_attn.attn.k_cache = self.kv_cache[0, i]
            layer.self_attn.attn.v_cache = self.kv_cache[1, i]
        self.num_blocks = num_blocks
        return num_blocks

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> SamplerOutput:
        """Run one step; returns a sampled token for each request whose scheduled tokens reach its end."""
        input_ids, positions, meta, sample_rows, sample_indices, order = self._prepare(out)
        if self.lora is not None:  # the mapping follows the flattened rows, which _prepare reorders
            self.lora.set_step([out.requests[i] for i in order], [out.num_scheduled_tokens[i] for i in order])
        # A graph captured without adapters skips the LoRA ops: steps with an adapter run eagerly.
        if self.graphs is not None and self.graphs.can_run(len(input_ids), meta) and (
                self.lora is None or self.lora.model.context.mapping is None):
            hidden = self.graphs.run(input_ids, positions, meta)
        else:
            hidden = self.model(input_ids, positions, meta)
        if not sample_indices:
            return SamplerOutput.empty(len(out.requests))
        logits = self.model.compute_logits(hidden[sample_rows])
        return self.sampler.sample(logits, [out.requests[i] for i in sample_indices], sample_indices,
                                   len(out.requests))

    def _prepare(self, out: SchedulerOutput):
        """Flatten the step: one-token rows (decodes) first, longest context first so the CPU decode path
        gathers sequences of similar length together; then the prefill chunks in scheduling order."""
        bs, dev = self.block_size, self.device
        scheduled = list(zip(out.requests, out.num_scheduled_tokens))
        decodes = sorted((i for i, (_, n) in enumerate(scheduled) if n == 1),
                         key=lambda i: -scheduled[i][0].num_computed_tokens)
        order = decodes + [i for i, (_, n) in enumerate(scheduled) if n != 1]
        input_ids, starts, lens, sample_rows, sample_indices = [], [], [], [], []
        for i in order:
            request, n = scheduled[i]
            start = request.num_computed_tokens
            input_ids.extend(request.all_token_ids[start:start + n])
            starts.append(start)
            lens.append(n)
            if start + n == request.num_tokens:
                sample_rows.append(len(input_ids) - 1)
                sample_indices.append(i)
        block_tables = [out.block_tables[i] for i in order]
        max_blocks = max(len(t) for t in block_tables)
        tables = torch.tensor([t + [0] * (max_blocks - len(t)) for t in block_tables], dtype=torch.int32)
        lens_t, starts_t = torch.tensor(lens), torch.tensor(starts)
        req_index = torch.repeat_interleave(torch.arange(len(lens)), lens_t)
        cu = torch.zeros(len(lens) + 1, dtype=torch.int64)
        torch.cumsum(lens_t, 0, out=cu[1:])
        positions = torch.arange(len(input_ids)) - cu[req_index] + starts_t[req_index]
        slot_mapping = tables[req_index, positions // bs].long() * bs + positions % bs
        context_lens = (starts_t + lens_t).to(torch.int32)
        nd = len(decodes)
        decode_tables = decode_lens = plan = None
        if nd:
            # Decode attention reads max_decode_blocks blocks per sequence: trim the padding prefills add.
            max_decode_blocks = -(-(starts[0] + 1) // bs)
            decode_tables, decode_lens = tables[:nd, :max_decode_blocks].to(dev), context_lens[:nd].to(dev)
            plan = self.kernels.plan_decode(decode_tables, decode_lens, bs)
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(dev), num_decode_tokens=nd,
            decode_block_tables=decode_tables, decode_context_lens=decode_lens,
            prefill_block_tables=tables[nd:].to(dev),
            prefill_cu_seqlens_q=(cu[nd:] - cu[nd]).to(torch.int32).to(dev),
            prefill_context_lens=context_lens[nd:].to(dev),
            max_prefill_query_len=max(lens[nd:], default=0), decode_plan=plan)
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        return ids, positions.to(dev), meta, torch.tensor(sample_rows, device=dev), sample_indices, order
