"""Host tensors on transparent huge pages (Linux), for the CPU KV cache.

Decode attention reads each sequence's K/V as scattered 4 KiB blocks of a cache of hundreds of MB: on 4 KiB
pages nearly every block read is a TLB miss and a page walk. Where THP is set to `madvise` (the common
default) memory must ask for huge pages before it is first touched, so the tensor is allocated untouched,
advised, then zeroed. Elsewhere (no THP, not Linux) the advice is refused and the tensor is plain memory.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

import torch

logger = logging.getLogger(__name__)

_MADV_HUGEPAGE = 14
_HUGE_PAGE = 2 << 20


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.zeros(shape, dtype) on the CPU, its 2 MiB-aligned interior advised MADV_HUGEPAGE first."""
    tensor = torch.empty(shape, dtype=dtype)
    if sys.platform.startswith("linux") and tensor.numel():
        start, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
        first = -(-start // _HUGE_PAGE) * _HUGE_PAGE
        end = (start + size) // _HUGE_PAGE * _HUGE_PAGE
        if end > first:
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            if libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(end - first), _MADV_HUGEPAGE) != 0:
                logger.debug("madvise(MADV_HUGEPAGE) refused (errno %d): 4 KiB pages", ctypes.get_errno())
    return tensor.zero_()
