"""GPU memory gauges: absent without CUDA; with a device, Triton's families per `gpu_uuid`. No GPU
here, so the CUDA side is an object with torch.cuda's API (the calls the gauges make)."""
from __future__ import annotations

import sys
import types

from prometheus_client.parser import text_string_to_metric_families

from modelplex.observability.host_metrics import GpuMetrics


class FakeCuda:
    def __init__(self, devices):
        self.devices = devices  # [(uuid, free, total)]

    def is_available(self):
        return bool(self.devices)

    def device_count(self):
        return len(self.devices)

    def mem_get_info(self, index):
        return self.devices[index][1], self.devices[index][2]

    def get_device_properties(self, index):
        return types.SimpleNamespace(uuid=self.devices[index][0])


def test_gauges_per_device_with_cuda():
    cuda = FakeCuda([("5b2c1f7e-0000-1111-2222-333344445555", 6 << 30, 16 << 30), ("GPU-abc", 1 << 30, 8 << 30)])
    families = {f.name: f for f in text_string_to_metric_families(GpuMetrics(cuda).text())}
    assert {f.type for f in families.values()} == {"gauge"}
    total = {s.labels["gpu_uuid"]: s.value for s in families["nv_gpu_memory_total_bytes"].samples}
    used = {s.labels["gpu_uuid"]: s.value for s in families["nv_gpu_memory_used_bytes"].samples}
    assert total == {"GPU-5b2c1f7e-0000-1111-2222-333344445555": 16 << 30, "GPU-abc": 8 << 30}
    assert used == {"GPU-5b2c1f7e-0000-1111-2222-333344445555": 10 << 30, "GPU-abc": 7 << 30}


def test_nothing_without_cuda_or_without_torch(monkeypatch):
    assert GpuMetrics(FakeCuda([])).text() == ""
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # a host that never loaded torch
    assert GpuMetrics().text() == ""


def test_a_failing_driver_gives_no_gauges():
    class Broken(FakeCuda):
        def mem_get_info(self, index):
            raise RuntimeError("CUDA error: unknown error")

    assert GpuMetrics(Broken([("GPU-x", 0, 1)])).text() == ""
