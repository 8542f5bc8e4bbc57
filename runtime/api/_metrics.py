"""Prometheus metrics, one CollectorRegistry per app (never the global one).

Two sources: the HTTP layer counts requests and observes each reply's Report
(tokens, TTFT, restore and prefill times, hits per tier); tier usage, evictions and
the queue are read from ``runtime.stats()`` at scrape time, so the runtime stays the
one owner of those numbers. Its shape is one (runtime/serving/_stats.py): a figure a runtime
does not have (no RAM pool, no disk tier) is absent, and its metric with it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..serving import Stats
from ..types import TIERS, Report

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class StatsSource(Protocol):
    """What the collector reads: a Runtime, or the server's view of whichever one is
    loaded (a model switch replaces it; see _state.LoadedStats)."""

    def stats(self) -> dict[str, Any]: ...


class _RuntimeCollector(Collector):
    """Reads tier usage, evictions and queue depth from ``runtime.stats()``."""

    def __init__(self, runtime: StatsSource) -> None:
        self._runtime = runtime

    def collect(self) -> Iterator[Metric]:
        try:
            raw = self._runtime.stats()
            stats = Stats.from_json(raw) if raw else None  # {}: no model loaded yet
        except Exception:  # a scrape must not fail because the runtime is busy or closing
            log.exception("runtime.stats() failed during a metrics scrape")
            return
        if stats is None:
            return
        yield from _tier_metrics(stats)
        if stats.disk.degraded is not None:
            yield GaugeMetricFamily(
                "warmstart_disk_tier_degraded",
                "1 while the disk tier cannot be written and the cache runs from RAM",
                value=int(stats.disk.degraded),
            )
        yield from _memory_metrics(stats)
        yield CounterMetricFamily(
            "warmstart_evictions", "cache entries evicted from the last tier", value=stats.evictions
        )
        for key, value in (("waiting", stats.queue.waiting), ("active", stats.queue.active)):
            yield GaugeMetricFamily(
                f"warmstart_queue_{key}", f"requests {key} in the runtime", value=value
            )


def _memory_metrics(stats: Stats) -> Iterator[Metric]:
    """The RAM pool's give-back under memory pressure (runtimes with a pool only)."""
    memory = stats.memory
    gauges = (
        ("warmstart_ram_pool_limit_bytes", "bytes the RAM pool may use now", stats.ram.limit_bytes),
        (
            "warmstart_ram_pool_resident_bytes",
            "bytes of the RAM pool that may be resident (given-back pages excluded)",
            stats.ram.resident_bytes,
        ),
        (
            "warmstart_memory_floor_bytes",
            "available system memory below which the RAM pool gives memory back",
            memory.floor_bytes if memory else None,
        ),
    )
    for name, doc, value in gauges:
        if value is not None:
            yield GaugeMetricFamily(name, doc, value=value)
    if memory is not None:
        yield CounterMetricFamily(
            "warmstart_memory_pressure_events",
            "times the RAM pool shrank because available memory fell below the floor",
            value=memory.pressure_events,
        )


def _tier_metrics(stats: Stats) -> Iterator[Metric]:
    families = (
        GaugeMetricFamily("warmstart_tier_bytes", "bytes used per tier", labels=["tier"]),
        GaugeMetricFamily("warmstart_tier_capacity_bytes", "byte budget per tier", labels=["tier"]),
        GaugeMetricFamily("warmstart_tier_tokens", "tokens held per tier", labels=["tier"]),
    )
    for tier, usage in (("live", stats.live), ("ram", stats.ram), ("disk", stats.disk)):
        for family, value in zip(
            families, (usage.bytes, usage.capacity_bytes, usage.tokens), strict=True
        ):
            family.add_metric([tier], value)
    yield from families


class Metrics:
    """The app's metrics; ``observe`` after each reply, ``render`` for /metrics."""

    def __init__(self, runtime: StatsSource) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.requests = Counter(
            "warmstart_http_requests", "HTTP requests", ["route", "status"], registry=reg
        )
        self.prompt_tokens = Counter("warmstart_prompt_tokens", "prompt tokens", registry=reg)
        self.completion_tokens = Counter(
            "warmstart_completion_tokens", "generated tokens", registry=reg
        )
        self.restored = Counter(
            "warmstart_restored_tokens", "prompt tokens restored per tier", ["tier"], registry=reg
        )
        self.hits = Counter(
            "warmstart_cache_hits", "replies that restored from a tier", ["tier"], registry=reg
        )
        self.misses = Counter(
            "warmstart_cache_misses", "replies with nothing restored", registry=reg
        )
        self.ttft = Histogram(
            "warmstart_ttft_seconds", "time to first token", buckets=_SECONDS, registry=reg
        )
        self.restore = Histogram(
            "warmstart_restore_seconds", "time restoring cached KV", buckets=_SECONDS, registry=reg
        )
        self.prefill = Histogram(
            "warmstart_prefill_seconds",
            "time computing uncached prompt tokens",
            buckets=_SECONDS,
            registry=reg,
        )
        for tier in TIERS:  # so every tier shows up at zero before its first hit
            self.restored.labels(tier)
            self.hits.labels(tier)
        reg.register(_RuntimeCollector(runtime))

    def count_request(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    def observe(self, report: Report) -> None:
        """Records one finished (or cancelled) reply."""
        self.prompt_tokens.inc(report.prompt_tokens)
        self.completion_tokens.inc(report.completion_tokens)
        for tier in TIERS:
            tokens = report.restored.get(tier, 0)
            if tokens:
                self.restored.labels(tier).inc(tokens)
                self.hits.labels(tier).inc()
        if report.cached_tokens == 0:
            self.misses.inc()
        self.ttft.observe(report.ttft_ms / 1000)
        self.prefill.observe(report.prefill_ms / 1000)
        if report.cached_tokens:
            self.restore.observe(report.restore_ms / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)
