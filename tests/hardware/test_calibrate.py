"""Calibration against a fake model, and its cache per (machine, model)."""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from warmstart.runtime.hardware import (
    Calibration,
    CalibrationTarget,
    HardwareProfile,
    _calibrate,
    _measure,
    calibrate,
    load_or_calibrate,
)

from tests.hardware.machines import LAPTOP, RTX4090, calibration_for


@dataclass
class FakeTarget:
    """Implements CalibrationTarget with a linear cost model and KV-like bytes."""

    fingerprint: str = "f0" * 32
    kv_bytes_per_token: int = 2048
    kv_layout: tuple[dict[str, Any], ...] | None = (
        {"meta_bytes": 12, "v_trans": False, "n_layer": 1, "k": [[1, 1024]], "v": [[1, 1024, 1]]},
    )
    tps: float = 2000.0
    set_gbps: float = 4.0
    calls: list[tuple[str, int]] = field(default_factory=list)

    def time_prefill(self, n_tokens: int) -> float:
        self.calls.append(("prefill", n_tokens))
        return 0.005 + n_tokens / self.tps

    def time_state_roundtrip(self, n_tokens: int) -> tuple[bytes, float, float]:
        self.calls.append(("state", n_tokens))
        # fp16-like values: compressible high bytes, noisy low bytes, as real KV is
        rng = np.random.default_rng(n_tokens)
        kv = rng.normal(0, 1, n_tokens * self.kv_bytes_per_token // 2).astype(np.float16)
        blob = kv.tobytes()
        return blob, len(blob) / 1e9, 0.0001 + len(blob) / (self.set_gbps * 1e9)

    def invariant_units(self, total: int, units: Sequence[int]) -> tuple[int, ...]:
        self.calls.append(("invariance", total))
        return tuple(units)

    def batch_kinds(self, tile: int) -> bool:
        self.calls.append(("kinds", tile))
        return True

    def batched_decode(self, counts: Sequence[int]) -> tuple[int, str]:
        self.calls.append(("decode", max(counts)))
        return max(counts), ""


@pytest.fixture(autouse=True)
def _small_io(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keeps calibration quick on a shared 2-core box: 4 MiB instead of 64."""
    monkeypatch.setattr(_calibrate, "disk_rates", partial(_measure.disk_rates, nbytes=4 << 20))
    monkeypatch.setattr(
        _calibrate, "ram_copy_gbps", partial(_measure.ram_copy_gbps, nbytes=4 << 20)
    )


def test_fake_target_is_a_target() -> None:
    target: CalibrationTarget = FakeTarget()
    assert target.fingerprint


@pytest.mark.parametrize(("profile", "lengths"), [(LAPTOP, (64, 256)), (RTX4090, (512, 2048))])
def test_calibrate_measures_everything(
    profile: HardwareProfile, lengths: tuple[int, int], tmp_path: Path
) -> None:
    target = FakeTarget()
    steps: list[tuple[str, float]] = []
    cal = calibrate(
        target, profile, tmp_path, progress=lambda what, done: steps.append((what, done))
    )
    assert (cal.prefill_short_tokens, cal.prefill_long_tokens) == lengths
    assert cal.prefill_tps == pytest.approx(2000.0, rel=0.01)  # fixed cost cancels out
    assert cal.prefill_fixed_ms == pytest.approx(5.0, rel=0.05)
    assert cal.state_set_gbps == pytest.approx(4.0, rel=0.1) and cal.state_fixed_ms > 0
    assert cal.ram_copy_gbps > 0 and cal.disk_read_gbps > 0 and cal.disk_write_gbps > 0
    assert [p.level for p in cal.zstd] == [1, 3, 9]
    assert all(0 < p.ratio < 1 and p.decompress_gbps > 0 for p in cal.zstd)
    assert cal.h2d_pinned_gbps is None  # no torch here
    assert cal.machine_id == profile.machine_id() and cal.fingerprint == target.fingerprint
    assert steps[-1] == ("done", 1.0) and [d for _, d in steps] == sorted(d for _, d in steps)
    assert list(tmp_path.iterdir()) == []  # the disk test file is gone


def test_each_prefill_run_is_announced_before_it_runs(tmp_path: Path) -> None:
    """The prefill step is the longest (47 s on a busy box, the bar sat at 0%): each
    of its runs moves the bar before it starts."""
    target = FakeTarget()
    events: list[Any] = target.calls  # the target's calls and the progress, in order
    calibrate(target, LAPTOP, tmp_path, progress=lambda what, done: events.append((what, done)))
    prefill = [e for e in events if e[0] == "prefill" or str(e[0]).startswith("prefill:")]
    assert prefill == [
        ("prefill", 0.0),
        ("prefill: warm-up (a context, the first decode)", 0.02),
        ("prefill", 8),
        ("prefill: 64 tokens", 0.1),
        ("prefill", 64),
        ("prefill: 256 tokens", 0.2),
        ("prefill", 256),
    ]


def test_a_slow_model_gets_a_shorter_long_prefill(tmp_path: Path) -> None:
    cal = calibrate(FakeTarget(tps=20.0), LAPTOP, tmp_path)
    assert cal.prefill_long_tokens == 128  # 3 s budget at 20 tok/s, but twice the short run


@pytest.mark.parametrize(
    ("short_s", "long_s", "tps"),
    # 64 and 256 tokens: normal, noise (long faster than short), a tiny difference
    [(0.1, 0.4, 640.0), (0.5, 0.4, 640.0), (0.1, 0.1001, 2 * 256 / 0.1001)],
)
def test_prefill_rate(short_s: float, long_s: float, tps: float) -> None:
    cal = replace(calibration_for(LAPTOP), prefill_short_s=short_s, prefill_long_s=long_s)
    assert cal.prefill_tps == pytest.approx(tps)


def test_calibration_json_round_trip() -> None:
    cal = calibration_for(RTX4090)
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal


def test_second_start_reuses_the_calibration(tmp_path: Path) -> None:
    cache = tmp_path / "calibration.json"
    target = FakeTarget()
    first, reused = load_or_calibrate(target, LAPTOP, cache, cache_dir=tmp_path / "kv")
    assert not reused and cache.is_file()
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o600
    measured = len(target.calls)
    second, reused = load_or_calibrate(target, LAPTOP, cache, cache_dir=tmp_path / "kv")
    assert reused and second == first and len(target.calls) == measured  # nothing re-measured


@pytest.mark.parametrize("change", ["model", "machine", "recalibrate"])
def test_a_change_triggers_a_new_calibration(change: str, tmp_path: Path) -> None:
    cache = tmp_path / "calibration.json"
    load_or_calibrate(FakeTarget(), LAPTOP, cache, cache_dir=tmp_path)
    target, profile = FakeTarget(), LAPTOP
    if change == "model":
        target = FakeTarget(fingerprint="0d" * 32)
    elif change == "machine":
        profile = replace(LAPTOP, memory=replace(LAPTOP.memory, total=32 << 30))
    cal, reused = load_or_calibrate(
        target, profile, cache, change == "recalibrate", cache_dir=tmp_path
    )
    assert not reused and target.calls and cal.fingerprint == target.fingerprint
    if change != "recalibrate":  # both entries are kept: switching back costs nothing
        assert load_or_calibrate(FakeTarget(), LAPTOP, cache, cache_dir=tmp_path)[1]


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"format": 99, "entries": {}}',
        "[]",
        # a current-format file with a malformed entry
        '{"format": FORMAT, "entries": {"%s": {"x": 1}}}',
    ],
)
def test_a_corrupt_cache_is_ignored_and_rewritten(
    content: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "calibration.json"
    key = f"{LAPTOP.machine_id()}/{FakeTarget().fingerprint}"
    cache.write_text(content.replace("%s", key).replace("FORMAT", str(_calibrate.FORMAT_VERSION)))
    with caplog.at_level(logging.WARNING):
        _, reused = load_or_calibrate(FakeTarget(), LAPTOP, cache, cache_dir=tmp_path)
    assert not reused and "unusable" in caplog.text
    assert load_or_calibrate(FakeTarget(), LAPTOP, cache, cache_dir=tmp_path)[1]


def test_an_older_format_is_measured_again_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "calibration.json"
    key = f"{LAPTOP.machine_id()}/{FakeTarget().fingerprint}"
    old = calibration_for(LAPTOP).to_dict()
    cache.write_text(json.dumps({"format": 1, "entries": {key: old}}))
    with caplog.at_level(logging.WARNING):
        cal, reused = load_or_calibrate(FakeTarget(), LAPTOP, cache, cache_dir=tmp_path)
    assert not reused and not caplog.records  # an upgrade is no cause for a warning
    assert cal.kv_layout == FakeTarget().kv_layout  # the KV layout is kept from now on
    again, reused = load_or_calibrate(FakeTarget(), LAPTOP, cache, cache_dir=tmp_path)
    assert reused and again.kv_layout == FakeTarget().kv_layout


def test_old_entries_are_dropped(tmp_path: Path) -> None:
    cache = tmp_path / "calibration.json"
    for i in range(10):
        load_or_calibrate(FakeTarget(fingerprint=f"{i:064x}"), LAPTOP, cache, cache_dir=tmp_path)
    assert len(json.loads(cache.read_text())["entries"]) == 8


def test_disk_rates_on_this_disk(tmp_path: Path) -> None:
    rates = _measure.disk_rates(tmp_path / "new", nbytes=2 << 20)
    assert rates.write_gbps > 0 and rates.read_gbps > 0 and rates.fixed_ms >= 0
    assert list((tmp_path / "new").iterdir()) == []


def test_zstd_on_incompressible_and_empty_bytes() -> None:
    assert _measure.zstd_points(b"", (1,)) == ()
    (point,) = _measure.zstd_points(os.urandom(1 << 20), (1,))
    assert point.ratio > 0.99
