"""Resident memory of loading an engine, measured in a child process that only loads: the load-memory tests'
and benchmarks' one helper (test_gguf_quantized.py, test_hf_bf16_load.py, benchmarks/gguf_decode.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

_BACKEND = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "backends", "native_gpu")

_CHILD = """
import json, sys
import torch
from modelplex_native_gpu.kernels import cpu
cpu.compiled_ops()
torch.ones(1) @ torch.ones(1)
from modelplex_native_gpu.config import EngineConfig
from modelplex_native_gpu.engine.llm_engine import LLMEngine
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
def peak_rss():  # VmHWM, reset below: the peak of the load alone (the ops' first build may have peaked higher)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = rss()
engine = LLMEngine(EngineConfig(**json.loads(sys.argv[1])))
print(json.dumps({"before": before, "after": rss(), "peak": peak_rss(), "weight_bytes": engine.runner.weight_bytes,
                  "kv_cache_bytes": engine.runner.kv_cache.numel() * engine.runner.kv_cache.element_size(),
                  "dtype": str(engine.runner.dtype).removeprefix("torch.")}))
"""


@dataclass
class LoadMemory:
    """Bytes resident before the engine was built, after, and at the peak in between (RSS, file pages included)."""

    before: int
    after: int
    peak: int
    weight_bytes: int  # what a decode step reads (engine.runner.weight_bytes)
    kv_cache_bytes: int
    dtype: str

    @property
    def peak_over_final(self) -> float:
        """The load's peak over what stays resident, both above the `before` baseline."""
        return (self.peak - self.before) / max(self.after - self.before, 1)


def measure_load(timeout_s: float = 900, **engine_config) -> LoadMemory:
    """Build LLMEngine(EngineConfig(**engine_config)) in a child process (this checkout's backend first on
    its path) and read its memory."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_BACKEND, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(engine_config)], capture_output=True,
                            text=True, timeout=timeout_s, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"the loading child failed: {result.stderr[-3000:]}")
    return LoadMemory(**json.loads(result.stdout.splitlines()[-1]))
