"""The RAM pool's give-back shows in /metrics (read from runtime.stats() at scrape time)."""

from __future__ import annotations

from typing import Any, cast

from warmstart.runtime.api._metrics import Metrics
from warmstart.runtime.serving._service import Runtime


class _Stats:
    def __init__(self, stats: dict[str, Any]) -> None:
        self._stats = stats

    def stats(self) -> dict[str, Any]:
        return self._stats


def _render(stats: dict[str, Any]) -> str:
    return Metrics(cast(Runtime, _Stats(stats))).render().decode()


def test_pool_limit_resident_floor_and_pressure_events() -> None:
    text = _render(
        {
            "tiers": {"ram": {"bytes": 10, "limit_bytes": 4096, "resident_bytes": 2048}},
            "memory": {"floor_bytes": 1 << 30, "pressure_events": 3},
        }
    )
    assert "warmstart_ram_pool_limit_bytes 4096.0" in text
    assert "warmstart_ram_pool_resident_bytes 2048.0" in text
    assert "warmstart_memory_floor_bytes 1.073741824e+09" in text
    assert "warmstart_memory_pressure_events_total 3.0" in text


def test_a_runtime_without_a_pool_has_none_of_them() -> None:
    text = _render({"tiers": {"ram": {"bytes": 0}}})
    assert "warmstart_ram_pool" not in text and "warmstart_memory" not in text
