"""Per-adapter LoRA metrics of one model version: requests and tokens (from the request path's series
per adapter), host and device loads and evictions, and vLLM's `vllm:lora_requests_info` (which
adapters run and wait now). A backend reports the latter in `engine_stats().lora`: `max_loras`,
`running` and `waiting` (adapter names), `adapters` (rows with disk_loads, slot_loads,
cpu_evictions, slot_evictions). Only adapters' series are printed."""
from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LABELS = ["model", "version", "lora_name"]


def lora_metric_families():
    return [
        CounterMetricFamily("modelplex:lora_requests", "Completions finished with a LoRA adapter", labels=LABELS),
        CounterMetricFamily("modelplex:lora_prompt_tokens", "Prompt tokens of requests with a LoRA adapter",
                            labels=LABELS),
        CounterMetricFamily("modelplex:lora_generation_tokens", "Tokens generated with a LoRA adapter",
                            labels=LABELS),
        CounterMetricFamily("modelplex:lora_loads", "LoRA adapter loads, by tier (disk -> host, host -> device)",
                            labels=[*LABELS, "tier"]),
        CounterMetricFamily("modelplex:lora_evictions", "LoRA adapter evictions, by tier (host, device)",
                            labels=[*LABELS, "tier"]),
        GaugeMetricFamily("vllm:lora_requests_info", "Adapters of running and waiting requests (value: the time)",
                          labels=["model", "version", "max_lora", "running_lora_adapters", "waiting_lora_adapters"]),
    ]


def add_lora_metrics(families, labels: list[str], series: dict, engines: list[dict]) -> None:
    """`series`: adapter name ("" = base model) -> Series; `engines`: each instance's `lora` stats."""
    requests, prompt, generation, loads, evictions, info = families
    for adapter, s in sorted(series.items()):
        if adapter:
            requests.add_metric([*labels, adapter], sum(s.finished.values()))
            prompt.add_metric([*labels, adapter], s.prompt_tokens)
            generation.add_metric([*labels, adapter], s.generation_tokens)
    counters: dict[str, dict[str, int]] = {}
    for engine in engines:
        for row in engine["adapters"]:
            merged = counters.setdefault(row["name"], {})
            for key in ("disk_loads", "slot_loads", "cpu_evictions", "slot_evictions"):
                merged[key] = merged.get(key, 0) + row[key]
    for adapter, c in sorted(counters.items()):
        loads.add_metric([*labels, adapter, "host"], c["disk_loads"])
        loads.add_metric([*labels, adapter, "device"], c["slot_loads"])
        evictions.add_metric([*labels, adapter, "host"], c["cpu_evictions"])
        evictions.add_metric([*labels, adapter, "device"], c["slot_evictions"])
    if engines:
        running = sorted({name for e in engines for name in e["running"]})
        waiting = sorted({name for e in engines for name in e["waiting"]})
        info.add_metric([*labels, str(sum(e["max_loras"] for e in engines)), ",".join(running), ",".join(waiting)],
                        time.time())
