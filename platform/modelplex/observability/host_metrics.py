"""Triton's host resource gauges: CPU utilization and memory (Linux /proc) and, when this process
uses CUDA through torch, GPU memory. The host never imports torch itself: a server without a GPU
backend shows no GPU families."""
from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)


class CpuMetrics:
    """Triton's `nv_cpu_*` gauges from /proc (Linux): utilization over the time since the last scrape."""

    def __init__(self):
        self._last = self._cpu_times()

    @staticmethod
    def _cpu_times() -> tuple[int, int] | None:
        """(busy, total) jiffies of all CPUs; None where /proc/stat does not exist."""
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields) - idle, sum(fields)

    @staticmethod
    def _memory() -> tuple[int, int] | None:
        try:
            with open("/proc/meminfo") as f:
                info = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f)}
        except (OSError, ValueError):
            return None
        return info["MemTotal"] - info.get("MemAvailable", info["MemFree"]), info["MemTotal"]

    def text(self) -> str:
        now, memory = self._cpu_times(), self._memory()
        lines = []
        if now is not None and self._last is not None:
            busy, total = now[0] - self._last[0], now[1] - self._last[1]
            lines += ["# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]", "# TYPE nv_cpu_utilization gauge",
                      f"nv_cpu_utilization {busy / total if total > 0 else 0.0}"]
        self._last = now
        if memory is not None:
            for name, doc, v in (("nv_cpu_memory_used_bytes", "CPU memory (RAM) in use, in bytes", memory[0]),
                                 ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", memory[1])):
                lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name} {float(v)}"]
        return "\n".join(lines) + "\n" if lines else ""


class GpuMetrics:
    """`nv_gpu_memory_total_bytes` / `nv_gpu_memory_used_bytes` per device (label `gpu_uuid`, as
    Triton), read through `torch.cuda` when a backend has imported torch and CUDA is available."""

    def __init__(self, cuda=None):
        self._cuda = cuda  # torch.cuda or an object with its API; None: found at scrape time

    def _devices(self) -> list[tuple[str, int, int]]:
        """(uuid, used bytes, total bytes) per visible device; none without CUDA."""
        cuda = self._cuda
        if cuda is None:
            torch = sys.modules.get("torch")  # only if a backend loaded it: never imported here
            cuda = getattr(torch, "cuda", None)
        try:
            if cuda is None or not cuda.is_available():
                return []
            devices = []
            for index in range(cuda.device_count()):
                free, total = cuda.mem_get_info(index)
                uuid = str(cuda.get_device_properties(index).uuid)
                devices.append((uuid if uuid.startswith("GPU-") else f"GPU-{uuid}", total - free, total))
            return devices
        except Exception:
            log.warning("cannot read GPU memory", exc_info=True)
            return []

    def text(self) -> str:
        devices = self._devices()
        if not devices:
            return ""
        lines = []
        for name, doc, column in (("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", 2),
                                  ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", 1)):
            lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
            lines += [f'{name}{{gpu_uuid="{d[0]}"}} {float(d[column])}' for d in devices]
        return "\n".join(lines) + "\n"
