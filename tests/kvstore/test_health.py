"""The disk tier's health (runtime/kvstore/_health.py) over a fake clock: degraded once
per episode, tried again every retry_s (or at once when asked), opened again when it
never opened, and back. tests/kvstore/test_disk_degrade.py runs it on real mounts."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from warmstart.runtime.errors import DiskFull, DiskUnavailable
from warmstart.runtime.kvstore._disk import DiskTier, DiskUsage
from warmstart.runtime.kvstore._health import DiskHealth


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Tier:
    """A disk tier as far as health looks at it: whether a probe write works."""

    def __init__(self, writable: bool) -> None:
        self.ok = writable

    def writable(self) -> bool:
        return self.ok


def test_a_degraded_tier_is_said_once_an_episode(caplog: pytest.LogCaptureFixture) -> None:
    health = DiskHealth(30.0, clock=Clock())
    with caplog.at_level(logging.WARNING):
        health.degrade(DiskFull("the cache disk is full"), opened=True)
        health.degrade(DiskUnavailable("read-only"), opened=True)
    assert health.degraded and health.reason == "read-only"
    assert (health.unavailable, health.full) == (2, 1)
    assert caplog.text.count("disk tier off") == 1 and "cache clear" not in caplog.text


def test_an_open_tier_is_probed_every_retry_s_or_at_once_when_asked() -> None:
    clock, tier = Clock(), Tier(writable=False)
    health = DiskHealth(30.0, clock=clock)
    # well: nothing to try
    assert health.usable(tier) is None  # type: ignore[arg-type]
    health.degrade("read-only", opened=True)
    clock.now += 29
    tier.ok = True
    assert health.usable(tier) is None  # type: ignore[arg-type]
    clock.now += 1
    assert health.usable(tier) is tier  # type: ignore[arg-type]
    tier.ok = False
    health.retry_now()
    assert health.usable(tier) is None and health.degraded  # type: ignore[arg-type]


def test_a_tier_that_never_opened_is_opened_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock, tries = Clock(), []

    def reopen() -> DiskTier:
        tries.append(clock.now)
        if len(tries) == 1:
            raise DiskUnavailable("still damaged")
        return DiskTier(tmp_path, "fp", 1, 1 << 30)

    health = DiskHealth(10.0, reopen, clock)
    with caplog.at_level(logging.WARNING):
        health.degrade("a damaged index", opened=False)
        clock.now += 10
        assert health.usable(None) is None and health.reason == "still damaged"
        assert health.usable(None) is None and len(tries) == 1  # not due again yet
        clock.now += 10
        tier = health.usable(None)
        assert tier is not None and health.degraded  # the store takes it back
        health.back(3)
    assert not health.degraded and health.reason is None
    assert "cache clear" in caplog.text and "disk tier back" in caplog.text
    assert DiskHealth(10.0, clock=clock).usable(None) is None  # no reopen: stays off
    tier.close()


def test_its_figures_are_the_tiers_counts_and_its_state() -> None:
    health = DiskHealth(30.0, clock=Clock())
    well = health.stats(DiskUsage(2, 10, 400, 4096))
    assert (well.chunks, well.tokens, well.kv_bytes, well.used_bytes) == (2, 10, 400, 4096)
    assert not well.degraded and well.degraded_reason is None
    health.degrade("full", opened=True)
    assert health.stats(DiskUsage()).degraded_reason == "full"
