"""One typed Stats, one JSON shape: the runtime builds it over the fake engine as over
llama.cpp (tests/serving/test_worker_view.py checks that one), and /metrics reads it back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from warmstart.runtime.engine._fake import FakeOptions
from warmstart.runtime.kvstore import StoreStats
from warmstart.runtime.serving._stats import DiskStats, LiveStats, MemoryStats, QueueStats, Stats
from warmstart.runtime.types import TIERS, Message, Request

from tests.conftest import fake_runtime


def test_the_fake_runtimes_stats_are_the_typed_shape(tmp_path: Path) -> None:
    rt = fake_runtime(tmp_path, FakeOptions(prefill_delay=0.0))
    try:
        rt.generate(Request(messages=(Message("user", "Hello"),), session_id="s")).text()
        raw = rt.stats()
    finally:
        rt.close()
    stats = Stats.from_json(raw)
    assert stats.to_json() == raw and json.loads(json.dumps(raw)) == raw
    assert stats.requests == 1 and stats.sessions == 1 and set(raw["tiers"]) == set(TIERS)
    assert stats.live.resident == 1 and stats.live.sequences > 0
    assert stats.disk.degraded is False and raw["tiers"]["disk"]["degraded"] is False


def test_a_full_value_round_trips_and_unknown_figures_stay_out() -> None:
    full = Stats(
        model="m",
        requests=3,
        hits={"live": 1, "ram": 0, "disk": 2},
        live=LiveStats(10, 100, 1000, sequences=2, resident=1),
        disk=DiskStats(5, 50, 500, chunks=1, kv_bytes=40, degraded=False),
        queue=QueueStats(0, 1, 8),
        decode_step_ms={"1": 12.5, "4": 30.25},
        memory=MemoryStats(floor_bytes=1 << 30),
        store=StoreStats(chunks=1),
    )
    raw = full.to_json()
    assert Stats.from_json(raw) == full
    assert raw["tiers"]["disk"]["degraded_reason"] is None  # said while the tier is well
    assert "sessions" not in raw["tiers"]["live"] and "limit_bytes" not in raw["tiers"]["ram"]
    assert raw["memory"]["available_bytes"] is None


@pytest.mark.parametrize(
    "bad",
    [
        {"tiers": {"cloud": {}}},
        {"tiers": {"ram": {"used": 1}}},
        {"queue": {"waiting": "many"}},
        {"requests": True},
        {"whatever": 1},
        {"tiers": []},
        {"decode_step_ms": {"1": "fast"}},
        {"decode_step_ms": [12.5]},
    ],
)
def test_another_shape_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Stats.from_json(bad)
