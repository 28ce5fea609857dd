"""The CPU execution path: the torch reference kernels, except small C++ ops: paged attention, decode
and prefill (csrc/paged_attention.cpp), which reads K/V in place from the paged cache instead of
gathering copies, the K/V cache write (csrc/store_kvcache.cpp), one call a layer instead of several, the
fp32 and bf16 layer ops the model fuses (csrc/layer_ops.cpp: RMSNorm with the residual add, rotary embedding)
and the fp32 linear layers on weights packed in column panels (csrc/linear.cpp, see layers/linear.py),
the bf16 ones likewise with vdpbf16ps where the CPU has AVX512_BF16 (csrc/linear_bf16.cpp),
and linear layers on GGUF-quantized weights (csrc/quant_linear.cpp; Q4_0 / Q4_1 repacked at load,
csrc/quant_repack.cpp; see layers/quantized.py; batches from csrc/quant_gemm.cpp's dequantized fp32 panels),
with a whole decoder layer at decode in one call on them (csrc/decode_layer.cpp), all of a step's layers in
one call and one parallel region on the 16-row groups (csrc/decode_step.cpp), a decoder layer or all of a
step's in one call on the packed fp32 and bf16 weights (csrc/dense_layer.cpp; a decode-only step in one
parallel region, csrc/dense_decode_step.cpp), and greedy sampling's argmax
over the rows in parallel (csrc/argmax.cpp). Headers (csrc/*.h) count
in the build's name as the sources do.

The ops are compiled on first use with torch.utils.cpp_extension (gcc, cached under ~/.cache/torch_extensions)
for this machine's CPU; without a compiler the engine logs why and keeps the torch reference, as it
does with MODELPLEX_CPU_ATTENTION=torch (for A/B measurements).
"""
from __future__ import annotations

import glob
import hashlib
import logging
import os
import threading

import torch

from .reference import paged_decode_attention as _reference_decode
from .reference import plan_decode as _reference_plan
from .reference import prefix_prefill_attention as _reference_prefill
from .reference import store_kvcache as _reference_store

__all__ = ["store_kvcache", "prefix_prefill_attention", "plan_decode", "paged_decode_attention", "compiled_ops"]

logger = logging.getLogger(__name__)
_BUILD_LOCK = threading.Lock()  # engines loading in parallel threads build (and register) it once
_ops = None
_built = False
_CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
_SOURCES = [os.path.join(_CSRC, name)
            for name in ("paged_attention.cpp", "store_kvcache.cpp", "layer_ops.cpp", "linear.cpp",
                          "linear_bf16.cpp", "quant_linear.cpp", "quant_repack.cpp", "quant_gemm.cpp",
                          "decode_layer.cpp", "decode_step.cpp", "dense_layer.cpp", "dense_decode_step.cpp",
                          "argmax.cpp")]
_COMPILED_PREFILL_DTYPES = (torch.float32, torch.bfloat16)
_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-ffp-contract=off"]


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def compiled_ops():
    """torch.ops.modelplex_cpu (attention, K/V store, fused layer ops, linears), or None when they cannot be
    built here."""
    global _ops, _built
    if not _built:  # every layer asks: no lock once it is decided
        with _BUILD_LOCK:
            if not _built:
                _ops, _built = _build(), True
    return _ops


def _build():
    if os.environ.get("MODELPLEX_CPU_ATTENTION") == "torch":
        return None
    from torch.utils import cpp_extension

    # The folder too: ninja rebuilds when build.ninja names other source paths, so two checkouts of the
    # same sources sharing one build folder rebuilt it in turn (each load waiting minutes on the other's lock).
    digest = hashlib.sha256((_cpu_flags() + " ".join(_CFLAGS) + _CSRC).encode())
    for source in _SOURCES + sorted(glob.glob(os.path.join(_CSRC, "*.h"))):
        with open(source, "rb") as f:
            digest.update(f.read())
    # -march=native: the build is cached by name, so the name carries the CPU's flags (and the sources and cflags).
    tag = digest.hexdigest()[:12]
    logger.info("loading the CPU kernels modelplex_cpu_ops_%s (compiled on their first use on this CPU: "
                "that can take minutes)", tag)
    try:
        cpp_extension.load(name=f"modelplex_cpu_ops_{tag}", sources=_SOURCES, is_python_module=False,
                           extra_cflags=_CFLAGS, extra_ldflags=["-fopenmp"])
    except Exception as e:  # no compiler, no ninja, a read-only cache...
        logger.warning("CPU ops not built (%s); using the torch reference path", e)
        return None
    return torch.ops.modelplex_cpu


def store_kvcache(key, value, k_cache, v_cache, slot_mapping) -> None:
    ops = compiled_ops()
    if ops is None or key.dtype != k_cache.dtype:
        _reference_store(key, value, k_cache, v_cache, slot_mapping)
    else:
        ops.store_kvcache(key, value, k_cache, v_cache, slot_mapping)


def plan_decode(block_tables, context_lens, block_size):
    """The compiled op needs no plan; the reference groups sequences by length."""
    return None if compiled_ops() is not None else _reference_plan(block_tables, context_lens, block_size)


def prefix_prefill_attention(query, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                             max_query_len=None, key=None, value=None):
    """fp32 and bf16: the compiled op, which reads every K/V from the cache (the layer stored the chunk's
    first); bf16 K/V are widened as read, fp32 softmax and products, one rounding of the output (as close to
    the fp32 model as torch's SDPA, not the same rounding: tests/native_gpu/test_bf16_vs_fp32.py)."""
    ops = compiled_ops()
    if ops is None or query.dtype not in _COMPILED_PREFILL_DTYPES or k_cache.dtype != query.dtype:
        return _reference_prefill(query, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                                  max_query_len, key, value)
    return ops.prefill_attention(query, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)


def paged_decode_attention(query, k_cache, v_cache, block_tables, context_lens, scale, plan=None):
    ops = compiled_ops()
    if ops is None:
        return _reference_decode(query, k_cache, v_cache, block_tables, context_lens, scale, plan)
    return ops.paged_decode_attention(query, k_cache, v_cache, block_tables, context_lens, scale)
