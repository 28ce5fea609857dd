"""Where the Triton kernel tests run: compiled on a CUDA device, else interpreted on CPU tensors in a child
pytest with TRITON_INTERPRET=1. Triton reads that variable when @triton.jit decorates a kernel, so it must
be set before the kernel modules are imported; a child process keeps it away from every other test."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"
ROOT = Path(__file__).resolve().parents[2]  # the repository: the child pytest reads its pyproject.toml

# Kernel tests run in this process on a GPU or under the interpreter; otherwise in the child below.
needs_triton = pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED,
                                  reason="no CUDA: runs in a child process under TRITON_INTERPRET=1")
runs_the_child = pytest.mark.skipif(DEVICE == "cuda" or INTERPRETED, reason="the kernels run in this process")


def run_interpreted(test_file: str, keyword: str) -> str:
    """Run the tests of `test_file` matching `keyword` under the interpreter; every one must pass."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file, "-k", keyword],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"\b[1-9]\d* passed", summary) and "skipped" not in summary, summary
    return summary
