"""The CPU execution path: the torch reference kernels, except paged decode attention, which is a small C++ op
(csrc/paged_decode_attention.cpp) that reads K/V in place from the paged cache instead of gathering copies.

The op is compiled on first use with torch.utils.cpp_extension (gcc, cached under ~/.cache/torch_extensions)
for this machine's CPU; without a compiler the engine logs why and keeps the torch reference, as it
does with MODELPLEX_CPU_ATTENTION=torch (for A/B measurements).
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading

import torch

from .reference import plan_decode as _reference_plan
from .reference import paged_decode_attention as _reference_decode
from .reference import prefix_prefill_attention, store_kvcache

__all__ = ["store_kvcache", "prefix_prefill_attention", "plan_decode", "paged_decode_attention", "compiled_decode_op"]

logger = logging.getLogger(__name__)
_BUILD_LOCK = threading.Lock()  # engines loading in parallel threads build (and register) it once
_op = None
_built = False
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "paged_decode_attention.cpp")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def compiled_decode_op():
    """torch.ops.modelplex_cpu.paged_decode_attention, or None when it cannot be built here."""
    global _op, _built
    if not _built:  # every layer asks: no lock once it is decided
        with _BUILD_LOCK:
            if not _built:
                _op, _built = _build(), True
    return _op


def _build():
    if os.environ.get("MODELPLEX_CPU_ATTENTION") == "torch":
        return None
    from torch.utils import cpp_extension

    with open(_SOURCE, "rb") as f:
        source = f.read()
    # -march=native: the build is cached by name, so the name carries the CPU's flags (and the source).
    tag = hashlib.sha256(source + _cpu_flags().encode()).hexdigest()[:12]
    try:
        cpp_extension.load(name=f"modelplex_cpu_attention_{tag}", sources=[_SOURCE], is_python_module=False,
                           extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-math-errno"], extra_ldflags=["-fopenmp"])
    except Exception as e:  # no compiler, no ninja, a read-only cache...
        logger.warning("CPU decode-attention op not built (%s); using the torch reference path", e)
        return None
    return torch.ops.modelplex_cpu.paged_decode_attention


def plan_decode(block_tables, context_lens, block_size):
    """The compiled op needs no plan; the reference groups sequences by length."""
    return None if compiled_decode_op() is not None else _reference_plan(block_tables, context_lens, block_size)


def paged_decode_attention(query, k_cache, v_cache, block_tables, context_lens, scale, plan=None):
    op = compiled_decode_op()
    if op is None:
        return _reference_decode(query, k_cache, v_cache, block_tables, context_lens, scale, plan)
    return op(query, k_cache, v_cache, block_tables, context_lens, scale)
