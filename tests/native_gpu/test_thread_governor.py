"""The CPU thread governor: thread count from the cores other processes leave free."""
import torch

from modelplex_native_gpu.engine.thread_governor import ThreadGovernor, choose_num_threads


def test_threads_follow_the_free_cores():
    assert choose_num_threads(0.0, max_threads=2, num_cpus=2) == 2
    assert choose_num_threads(0.2, max_threads=2, num_cpus=2) == 2  # a core 3/4 free still counts
    assert choose_num_threads(0.8, max_threads=2, num_cpus=2) == 1
    assert choose_num_threads(14.0, max_threads=2, num_cpus=2) == 1  # never below one
    assert choose_num_threads(1.0, max_threads=4, num_cpus=8) == 4  # never above the configured maximum


def test_governor_sets_torch_threads_only_when_its_choice_changes(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    governor = ThreadGovernor(max_threads=2, interval_s=0.0)
    governor.num_cpus = 2
    busy = iter([10.0, 11.6, 13.2, 13.4])  # /proc/stat busy CPU seconds at successive updates, 1 s apart
    now = iter([100.0, 101.0, 102.0, 103.0])
    module = "modelplex_native_gpu.engine.thread_governor"
    monkeypatch.setattr(f"{module}._busy_cpu_seconds", lambda: next(busy))
    monkeypatch.setattr(f"{module}.time.monotonic", lambda: next(now))
    monkeypatch.setattr(f"{module}.time.process_time", lambda: 0.0)  # our own process uses nothing
    governor._last = (99.0, 10.0, 0.0)
    assert [governor.update() for _ in range(4)] == [2, 1, 1, 2]  # idle, 1.6 cores busy twice, 0.2 busy
    assert calls == [1, 2]
