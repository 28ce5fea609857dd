"""The CPU KV cache's allocation on huge pages: zeros of the asked shape and dtype, and where transparent huge
pages are on (`always` or `madvise`), memory that the kernel backs with them."""
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


def huge_kib(t: torch.Tensor) -> int:
    """AnonHugePages of the mappings that hold t's bytes (from /proc/self/smaps; madvise splits a mapping)."""
    first, last = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start < last and first < end
            elif inside and line.startswith("AnonHugePages:"):
                total += int(line.split()[1])
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
    assert huge_kib(engine.runner.kv_cache) >= 32 << 10  # most of its 64 MiB
    assert huge_kib(torch.zeros(16 << 20)) == 0 or thp_mode() == "always"  # plain allocations are not advised
