"""ThreadGovernor: picks the CPU path's intra-op thread count from how busy the other processes keep the cores.

Every parallel torch op ends in a barrier that waits for its slowest thread. When other processes keep
the cores busy, one of our threads is often descheduled and each op then costs a scheduler time slice:
on a 2-core machine under a load of ~15, a 16-sequence decode step took 5.7 s on 2 threads and 1.25 s on
1. So while the cores our threads would share are taken, run on fewer threads; go back when they free up.
"""
from __future__ import annotations

import os
import time

import torch


def choose_num_threads(foreign_cores: float, max_threads: int, num_cpus: int) -> int:
    """Threads that fit on the cores other processes leave free (at least 1, at most max_threads)."""
    free = num_cpus - foreign_cores
    return max(1, min(max_threads, int(free + 0.25)))  # a core 3/4 free still counts


def _busy_cpu_seconds() -> float | None:
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, irq, softirq = fields[0], fields[1], fields[2], fields[5], fields[6]
    steal = fields[7] if len(fields) > 7 else 0
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class ThreadGovernor:
    """Call `update()` once per engine step; it re-decides at most every `interval_s` seconds."""

    def __init__(self, max_threads: int, interval_s: float = 0.5):
        self.max_threads = max_threads
        self.num_cpus = os.cpu_count() or 1
        self.interval_s = interval_s
        self.num_threads = max_threads
        self._last = (time.monotonic(), _busy_cpu_seconds(), time.process_time())

    def update(self) -> int:
        now = time.monotonic()
        t0, busy0, own0 = self._last
        if busy0 is None or now - t0 < self.interval_s:
            return self.num_threads
        busy, own = _busy_cpu_seconds(), time.process_time()
        self._last = (now, busy, own)
        if busy is None:
            return self.num_threads
        foreign = max(0.0, (busy - busy0) - (own - own0)) / (now - t0)
        wanted = choose_num_threads(foreign, self.max_threads, self.num_cpus)
        if wanted != self.num_threads:
            torch.set_num_threads(wanted)
            self.num_threads = wanted
        return wanted
