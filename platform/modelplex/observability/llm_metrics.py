"""The LLM metric family (vLLM's `vllm:*` names; Triton's `model`/`version` labels plus vLLM's `model_name`),
per model version, for every LLM backend.

An LLM instance keeps an `LLMMetrics` in its attribute `ModelInstance.llm_metrics`; its request path only adds to
plain numbers there (under a lock). `LLMMetricsCollector` merges the instances of a version at scrape
time and reads the engine gauges from `ModelInstance.engine_stats()` (an `EngineStats`) then: `num_running`,
`num_waiting`, and either `kv_cache_usage` (0-1) or `num_blocks` / `num_free_blocks`; the prefix-cache
and preemption counters where the engine counts them (0 otherwise). Series are kept per adapter (`""`: the base
model) so
per-adapter series only need a label where `_labels` builds them.
"""
from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from ..core.backend import EngineStats
from .lora_metrics import add_lora_metrics, lora_metric_families

# vLLM's buckets, so dashboards built for vLLM read ours unchanged.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
# vLLM's request-level buckets: token counts 1-2-5 up to 100k, phase times up to 40 min
TOKEN_BUCKETS = tuple(m * 10 ** e for e in range(6) for m in (1, 2, 5))
PHASE_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                 480.0, 960.0, 1920.0, 7680.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
LABELS = ["model", "version", "model_name"]  # model_name (vLLM's label) = model


class Histogram:
    """Cumulative-at-render bucket counts; merged across instances by adding."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def add(self, other: Histogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.sum += other.sum

    def buckets(self) -> list[tuple[str, int]]:
        total, out = 0, []
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            total += count
            out.append((bound, total))
        return out


@dataclass
class Series:
    """What the request path records for one (model version, adapter)."""

    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    request_prompt_tokens: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    request_generation_tokens: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(PHASE_BUCKETS))
    prefill_time: Histogram = field(default_factory=lambda: Histogram(PHASE_BUCKETS))
    decode_time: Histogram = field(default_factory=lambda: Histogram(PHASE_BUCKETS))
    time_per_output_token: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: Counter = field(default_factory=Counter)  # finish reason -> requests

    HISTOGRAMS = ("ttft", "itl", "e2e", "request_prompt_tokens", "request_generation_tokens", "queue_time",
                  "prefill_time", "decode_time", "time_per_output_token")

    def add(self, other: Series) -> None:
        for name in self.HISTOGRAMS:
            getattr(self, name).add(getattr(other, name))
        self.prompt_tokens += other.prompt_tokens
        self.generation_tokens += other.generation_tokens
        self.finished.update(other.finished)


class LLMMetrics:
    """One instance's recorded latencies and token counts, by adapter. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._series: dict[str, Series] = {}

    def timer(self, adapter: str = "") -> RequestTimer:
        return RequestTimer(self, adapter)

    def record(self, adapter: str, update) -> None:
        with self._lock:
            series = self._series.get(adapter)
            if series is None:
                series = self._series[adapter] = Series()
            update(series)

    def latency_sums(self) -> dict:
        """TTFT and ITL sums and counts over all adapters (the status page's means, from engine_stats)."""
        sums = {"ttft_seconds_sum": 0.0, "ttft_count": 0, "itl_seconds_sum": 0.0, "itl_count": 0}
        for series in self.snapshot().values():
            sums["ttft_seconds_sum"] += series.ttft.sum
            sums["ttft_count"] += sum(series.ttft.counts)
            sums["itl_seconds_sum"] += series.itl.sum
            sums["itl_count"] += sum(series.itl.counts)
        return sums

    def snapshot(self) -> dict[str, Series]:
        """A copy, merged into other instances' at scrape time."""
        with self._lock:
            out = {}
            for adapter, series in self._series.items():
                copy = out[adapter] = Series()
                copy.add(series)
            return out


class RequestTimer:
    """Follows one request's outputs: TTFT at its first token, one inter-token gap per later token
    (per completion when n > 1), end-to-end and finish reasons when its completions end."""

    def __init__(self, metrics: LLMMetrics, adapter: str):
        self.metrics, self.adapter = metrics, adapter
        self.started = time.perf_counter()
        self._last: dict[int, float] = {}  # completion index -> time of its last token
        self._first: dict[int, float] = {}  # completion index -> time of its first token
        self._count: Counter = Counter()  # completion index -> tokens so far

    def on_tokens(self, index: int, num_new_tokens: int, finished: bool, finish_reason: str | None,
                  num_prompt_tokens: int, phases: tuple[float, float] | None = None) -> None:
        """Completion `index` produced `num_new_tokens` (and ended, when `finished`). `phases`: the
        engine's queue and prefill times of the request in seconds, where it measures them."""
        if not num_new_tokens and not finished:
            return
        now = time.perf_counter()
        first = not self._last
        last = self._last.get(index)
        self._last[index] = now
        self._first.setdefault(index, now)
        self._count[index] += num_new_tokens
        num_tokens, decode = self._count[index], now - self._first[index]

        def update(series: Series) -> None:
            if first:
                series.ttft.observe(now - self.started)
                series.prompt_tokens += num_prompt_tokens
                series.request_prompt_tokens.observe(num_prompt_tokens)
                if phases is not None:
                    series.queue_time.observe(phases[0])
                    series.prefill_time.observe(phases[1])
            if last is not None and num_new_tokens:
                gap = (now - last) / num_new_tokens
                for _ in range(num_new_tokens):
                    series.itl.observe(gap)
            series.generation_tokens += num_new_tokens
            if finished:
                series.finished[finish_reason or "abort"] += 1
                series.e2e.observe(now - self.started)
                series.request_generation_tokens.observe(num_tokens)
                series.decode_time.observe(decode)
                if num_tokens > 1:
                    series.time_per_output_token.observe(decode / (num_tokens - 1))

        self.metrics.record(self.adapter, update)


class LLMMetricsCollector:
    """Renders the metrics of every ready instance that keeps `llm_metrics` on the server's registry."""

    def __init__(self, dataplane):
        self.dataplane = dataplane

    def describe(self):
        return self._families()

    def collect(self):
        gathered = self._gather()
        if not gathered:
            return []  # no LLM loaded: no empty families on the page
        families = self._families()
        histograms, rest = families[:len(Series.HISTOGRAMS)], families[len(Series.HISTOGRAMS):]
        (prompt, generation, success, running, waiting, kv_usage, queries, hits, hit_rate, preemptions,
         cache_info) = rest
        lora_families = lora_metric_families()
        for (model, version), (series, engines) in gathered.items():
            labels = [model, version, model]
            s = Series()  # vLLM's families sum the base model and every adapter
            for one in series.values():
                s.add(one)
            for family, name in zip(histograms, Series.HISTOGRAMS):
                histogram = getattr(s, name)
                family.add_metric(labels, histogram.buckets(), histogram.sum)
            if engines and engines[0].block_size is not None:
                cache_info.add_metric([*labels, str(engines[0].block_size),
                                       str(sum(e.num_blocks or 0 for e in engines))], 1)
            prompt.add_metric(labels, s.prompt_tokens)
            generation.add_metric(labels, s.generation_tokens)
            for reason, count in sorted(s.finished.items()):
                success.add_metric([*labels, reason], count)
            add_lora_metrics(lora_families, labels[:2], series, [e.lora for e in engines if e.lora is not None])
            running.add_metric(labels, sum(e.num_running for e in engines))
            waiting.add_metric(labels, sum(e.num_waiting for e in engines))
            kv_usage.add_metric(labels, sum(e.kv_usage for e in engines) / len(engines) if engines else 0.0)
            num_queries = sum(e.num_prefix_queries for e in engines)
            num_hits = sum(e.num_prefix_hits for e in engines)
            queries.add_metric(labels, num_queries)
            hits.add_metric(labels, num_hits)
            hit_rate.add_metric(labels, num_hits / num_queries if num_queries else 0.0)
            preemptions.add_metric(labels, sum(e.num_preemptions for e in engines))
        return families + [f for f in lora_families if f.samples]

    def _gather(self) -> dict[tuple[str, str], tuple[dict[str, Series], list[EngineStats]]]:
        """Per model version: its instances' series merged by adapter, and their engine stats."""
        out: dict[tuple[str, str], tuple[dict[str, Series], list[EngineStats]]] = {}
        for model, version, instance in self.dataplane.ready_instances():
            metrics = instance.llm_metrics
            if metrics is None:
                continue
            merged, engines = out.setdefault((model, version), ({}, []))
            for adapter, series in metrics.snapshot().items():
                merged.setdefault(adapter, Series()).add(series)
            engines.append(instance.engine_stats() or EngineStats())
        return out

    @staticmethod
    def _families():
        return [
            HistogramMetricFamily("vllm:time_to_first_token_seconds",
                                  "Time from admission to the first generated token, in seconds", labels=LABELS),
            HistogramMetricFamily("vllm:inter_token_latency_seconds",
                                  "Time between two generated tokens of a request, in seconds", labels=LABELS),
            HistogramMetricFamily("vllm:e2e_request_latency_seconds",
                                  "Time from admission to the last token of a request, in seconds", labels=LABELS),
            HistogramMetricFamily("vllm:request_prompt_tokens", "Prompt tokens of each request", labels=LABELS),
            HistogramMetricFamily("vllm:request_generation_tokens", "Tokens generated by each finished completion",
                                  labels=LABELS),
            HistogramMetricFamily("vllm:request_queue_time_seconds",
                                  "Time a request waited in the engine's queue, in seconds", labels=LABELS),
            HistogramMetricFamily("vllm:request_prefill_time_seconds",
                                  "Time from a request's first scheduling to its first token, in seconds",
                                  labels=LABELS),
            HistogramMetricFamily("vllm:request_decode_time_seconds",
                                  "Time from a completion's first token to its last, in seconds", labels=LABELS),
            HistogramMetricFamily("vllm:request_time_per_output_token_seconds",
                                  "Mean time per output token after the first of each finished completion, in "
                                  "seconds", labels=LABELS),
            CounterMetricFamily("vllm:prompt_tokens", "Prompt tokens of the requests served", labels=LABELS),
            CounterMetricFamily("vllm:generation_tokens", "Tokens generated", labels=LABELS),
            CounterMetricFamily("vllm:request_success", "Completions finished, by finish reason",
                                labels=[*LABELS, "finished_reason"]),
            GaugeMetricFamily("vllm:num_requests_running", "Requests in the engine's running batch",
                              labels=LABELS),
            GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting for a place in the running batch",
                              labels=LABELS),
            GaugeMetricFamily("vllm:kv_cache_usage_perc", "Share of KV-cache blocks in use, 0.0-1.0",
                              labels=LABELS),
            CounterMetricFamily("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                labels=LABELS),
            CounterMetricFamily("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache",
                                labels=LABELS),
            GaugeMetricFamily("vllm:prefix_cache_hit_rate",
                              "Share of looked-up prompt tokens found in the prefix cache since load",
                              labels=LABELS),
            CounterMetricFamily("vllm:num_preemptions", "Requests preempted (their KV blocks taken back)",
                                labels=LABELS),
            GaugeMetricFamily("vllm:cache_config_info", "The KV cache's configuration (value 1)",
                              labels=[*LABELS, "block_size", "num_gpu_blocks"]),
        ]
