"""The CPU KV cache's allocation on huge pages: zeros of the asked shape and dtype, and where transparent huge
pages are on (`always` or `madvise`), memory advised MADV_HUGEPAGE before its first touch. Whether the kernel
then backs it with huge pages depends on free 2 MiB pages (a busy, fragmented machine may have none), so the
advice is what is checked (`hg` in the mapping's VmFlags)."""
import mmap
import os

import pytest
import torch

from modelplex_native_gpu.engine.huge_pages import zeros_on_huge_pages

THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode() -> str:
    try:
        with open(THP) as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "unavailable"


def advised_bytes(t: torch.Tensor) -> int:
    """Bytes of t inside mappings advised MADV_HUGEPAGE (from /proc/self/smaps; madvise splits a mapping)."""
    first, last = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    total, overlap = 0, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                overlap = max(0, min(end, last) - max(start, first))
            elif overlap and line.startswith("VmFlags:") and "hg" in line.split()[1:]:
                total += overlap
    return total


def test_zeros_of_the_shape_and_dtype():
    for shape, dtype in (((2, 3, 5 << 20), torch.float32), ((7, 1 << 20), torch.bfloat16), ((0, 4), torch.float32),
                         ((3, 5), torch.float32)):  # below one huge page: nothing to advise
        t = zeros_on_huge_pages(shape, dtype)
        assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
        assert not t.any()


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps") or thp_mode() not in ("always", "madvise"),
                    reason="no transparent huge pages here")
def test_the_runner_kv_cache_lies_on_huge_pages(make_engine):
    engine = make_engine(kv_cache_memory_bytes=64 << 20)
    kv = engine.runner.kv_cache
    assert advised_bytes(kv) >= kv.numel() * kv.element_size() - (4 << 20)  # all but its unaligned ends
    # Plain memory is not advised. A fresh mapping, not torch.zeros: malloc may hand out freed heap memory that
    # an earlier test's quantized weights advised (VmFlags outlive free()).
    plain = mmap.mmap(-1, 64 << 20)
    view = torch.frombuffer(plain, dtype=torch.uint8)
    view.fill_(1)
    assert advised_bytes(view) == 0
    del view
    plain.close()
