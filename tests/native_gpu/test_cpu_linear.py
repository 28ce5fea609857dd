"""The CPU path's fp32 linear layers (kernels/csrc/linear.cpp) against torch's, on every ISA path it has."""
import os
import subprocess
import sys

import pytest
import torch
from helpers.linear_check import check_against_torch

from modelplex_native_gpu.kernels import cpu


def test_packed_linear_matches_torch_and_does_not_depend_on_the_batch(ops):
    check_against_torch(ops)


def test_bad_shapes_are_refused(ops):
    packed = ops.pack_linear_weight(torch.randn(64, 32))
    with pytest.raises(RuntimeError, match="packed"):
        ops.packed_linear(torch.randn(2, 48), packed, 64, None)  # in_features differ
    with pytest.raises(RuntimeError, match="bias"):
        ops.packed_linear(torch.randn(2, 32), packed, 64, torch.randn(63))


# The other ISA paths, built alone in a child process (the op names would clash with the ones loaded here).
OTHER_BUILD = """
import sys, torch
from torch.utils import cpp_extension
from helpers.linear_check import check_against_torch
cpp_extension.load(name="modelplex_linear_" + sys.argv[1].replace("-", "_"), sources=[sys.argv[3]], is_python_module=False,
                   extra_cflags=["-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off"] + sys.argv[4:])
check_against_torch(torch.ops.modelplex_cpu)
print("ok")
"""


@pytest.mark.parametrize("flags", [["-mno-avx512f"], ["-mno-avx512f", "-mno-avx2", "-mno-fma"]], ids=["avx2", "portable"])
def test_the_avx2_and_portable_builds_match_torch(flags):
    source = os.path.join(os.path.dirname(cpu.__file__), "csrc", "linear.cpp")
    tag = "avx2" if len(flags) == 1 else "portable"
    tests = os.path.dirname(os.path.dirname(__file__))  # the child imports helpers.linear_check from there
    result = subprocess.run([sys.executable, "-c", OTHER_BUILD, tag, tests, source, *flags],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": tests})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
