"""The GPU check (scripts/gpu_check) run end to end as its CPU dry run, so it does not rot without a GPU:
every section must pass and the report must hold each section's results."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_dry_run_passes_every_section(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("transformers")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    env["PYTHON"] = sys.executable
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check" / "gpu_check.sh"), "--budget-s", "300"],
                          env={**env, "OUT": str(tmp_path)}, capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "gpu_report.json").read_text())
    statuses = {name: s["status"] for name, s in report["sections"].items()}
    assert proc.returncode == 0 and set(statuses.values()) == {"ok"}, (statuses, proc.stdout[-4000:])
    sections = report["sections"]
    assert sections["kernels"]["results"]["kernel tests"]["passed"] > 20
    assert sections["consistency"]["results"]["preemptions"] > 0
    assert any(key.startswith("transformers batch") for key in sections["throughput"]["results"])
    assert all(sections["quantized"]["results"][f"{t} batch-8 tok/s"] > 0 for t in ("Q4_0", "Q8_0"))
    assert sections["server"]["results"]["openai streamed chat"]["usage"]["completion_tokens"] > 0
    assert "CPU dry run" in (tmp_path / "gpu_report.md").read_text()
