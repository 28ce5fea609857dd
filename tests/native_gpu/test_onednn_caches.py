"""The native_gpu plugin bounds oneDNN's and ideep's kernel caches: a server's engine meets a new matmul
shape at every distinct step size, and with the libraries' defaults each shape's kernels stay resident."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

# Malloc'd bytes held after matmuls of 300 distinct row counts through a packed linear (the engine's).
PROBE = """
import ctypes, sys
if sys.argv[1] == "plugin":
    import modelplex_native_gpu.plugin  # what server start-up does
import torch

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
mallinfo2.restype = MallInfo2
torch.set_num_threads(1)
weight = torch.ops.mkldnn._reorder_linear_weight(torch.randn(1536, 576), 32)
before = mallinfo2().uordblks
for rows in range(1, 301):
    torch.ops.mkldnn._linear_pointwise(torch.randn(rows, 576), weight, None, "none", [], "")
print((mallinfo2().uordblks - before) / 1e6)
"""


def held_mb(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    result = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return float(result.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads glibc's mallinfo2")
def test_plugin_bounds_the_matmul_kernel_caches():
    bounded, unbounded = held_mb("plugin"), held_mb("bare")
    assert unbounded > 100, f"the probe no longer sees the caches grow ({unbounded:.0f} MB without the plugin)"
    assert bounded < 30, f"{bounded:.0f} MB held after 300 shapes with the plugin imported ({unbounded:.0f} without)"


def test_an_operators_own_capacity_wins():
    env = {**os.environ, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "256", "LRU_CACHE_CAPACITY": "64"}
    code = ("import os, modelplex_native_gpu.plugin; "
            "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], os.environ['LRU_CACHE_CAPACITY'])")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["256", "64"], result.stderr
