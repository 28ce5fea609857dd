"""The Triton kernel tests against their torch references: compiled for the GPU (TRITON_INTERPRET unset),
or interpreted on CPU tensors in the dry run; plus the tests marked `gpu` (CUDA graphs)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

KERNEL_TESTS = ["tests/native_gpu/test_kernels.py", "tests/multilora/test_lora_ops.py",
                "tests/native_gpu/test_cuda_graphs.py"]
QUANTIZED_GLOB = "test_triton_quant*.py"  # Triton quantized-matmul tests, once they exist (not the CPU ops)


def run(check, report) -> None:
    quantized = sorted(str(p.relative_to(check.root)) for p in (check.root / "tests" / "native_gpu").glob(QUANTIZED_GLOB))
    if not quantized:
        report.note("quantized-matmul kernels: none in the tree yet (skipped)")
    env = dict(os.environ)
    if check.dry_run:
        env["TRITON_INTERPRET"] = "1"  # this pytest process only: the kernels then run on CPU tensors
    else:
        env.pop("TRITON_INTERPRET", None)
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *KERNEL_TESTS, *quantized]
    report.note("running: " + " ".join(command[2:]) + ("  (TRITON_INTERPRET=1)" if check.dry_run else "  (compiled)"))
    proc = subprocess.run(command, cwd=check.root, env=env, capture_output=True, text=True, timeout=check.timeout(300))
    (check.out_dir / "kernel_tests.log").write_text(proc.stdout + proc.stderr)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", summary)}
    passed = counts.get("passed", 0)
    report.result("kernel tests", counts, ok=proc.returncode == 0 and passed > 0,
                  text=f"kernel tests: {summary} (log: kernel_tests.log)")
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    for line in skipped:
        report.note(line)
