"""Per model-version statistics in the shape of Triton's statistics extension (also read by /metrics)."""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def to_dict(self) -> dict:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class ModelStats:
    """Counters of one model version. Plain integers: the request path must stay cheap."""

    _PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
               "cache_hit", "cache_miss")

    def __init__(self, name: str, version: str):
        self.name, self.version = name, version
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.pending = 0
        self.load_seconds = 0.0
        self.phases = {p: Duration() for p in self._PHASES}
        self.failures: dict[str, int] = defaultdict(int)
        self.batches: dict[int, BatchStats] = {}
        self.steps: dict[str, Duration] = {}  # ensembles: time in each step, "<step>:<model>"

    def record_execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One backend call that served `batch_size` inferences."""
        self.execution_count += 1
        self.inference_count += batch_size
        batch = self.batches.get(batch_size)
        if batch is None:
            batch = self.batches[batch_size] = BatchStats()
        batch.compute_input.add(input_ns)
        batch.compute_infer.add(infer_ns)
        batch.compute_output.add(output_ns)

    def record_step(self, step: str, ns: int) -> None:
        duration = self.steps.get(step)
        if duration is None:
            duration = self.steps[step] = Duration()
        duration.add(ns)

    def record_request(self, ok: bool, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int,
                       output_ns: int, reason: str = "OTHER") -> None:
        """One client request finished (successfully or not); failures count per Triton reason."""
        self.last_inference_ms = time.time_ns() // 1_000_000
        p = self.phases
        if ok:
            p["success"].add(total_ns)
            p["queue"].add(queue_ns)
            p["compute_input"].add(input_ns)
            p["compute_infer"].add(infer_ns)
            p["compute_output"].add(output_ns)
        else:
            p["fail"].add(total_ns)
            self.failures[reason] += 1

    def to_dict(self) -> dict:
        data = {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {p: d.to_dict() for p, d in self.phases.items()},
            "response_stats": {},
            "batch_stats": [
                {"batch_size": size, "compute_input": b.compute_input.to_dict(),
                 "compute_infer": b.compute_infer.to_dict(), "compute_output": b.compute_output.to_dict()}
                for size, b in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }
        if self.steps:  # not in Triton's schema: JSON only (the gRPC message has no such field)
            data["step_stats"] = [{"step": step, **d.to_dict()} for step, d in self.steps.items()]
        return data
