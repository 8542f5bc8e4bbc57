"""Degrade, never die: a cache dir that is full, read-only, damaged or not ours means
RAM only with one warning (log, stats, /health, a metric, doctor), replies keep
coming, and the disk tier comes back once it can write again.

Run as root here, so a chmod 0500 would not stop anyone: read-only and full are
made with tmpfs mounts (skipped where mounting is not permitted)."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from warmstart.runtime.errors import DiskUnavailable
from warmstart.runtime.hardware._calibrate import _disk_or_assumed
from warmstart.runtime.kvstore._disk import DiskTier, directory_problem

from tests.conftest import chat, wait_for

Mount = Callable[..., Path]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Mount]:
    where = tmp_path / "mnt"
    where.mkdir()
    mounted: list[Path] = []

    def mount(*options: str) -> Path:
        if hasattr(os, "geteuid") and os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _remount(where: Path, option: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{option}", str(where)], check=True)


def _fill(where: Path) -> Path:
    filler = where / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(bytes(1 << 20))
                f.flush()
        except OSError:
            pass
    return filler


def _answer(rt, question: str) -> str:  # type: ignore[no-untyped-def]
    text, _ = rt.generate(chat(question, max_tokens=4)).text()
    rt.wait_idle(60)
    return str(text)


def _warnings(caplog: pytest.LogCaptureFixture, words: str) -> int:
    return sum(1 for r in caplog.records if r.levelno >= logging.WARNING and words in r.message)


# no model -------------------------------------------------------------------------------------
def test_a_damaged_index_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "blobs").mkdir(parents=True)
    (tmp_path / "blobs" / "cache.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(DiskUnavailable):
        DiskTier(tmp_path, "fp", 1, 1 << 30)


def test_a_directory_of_another_user_is_unavailable(tmp_path: Path) -> None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("giving a directory away needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 54321, 54321)
    with pytest.raises(DiskUnavailable, match="another user"):
        DiskTier(theirs, "fp", 1, 1 << 30)
    assert "another user" in str(directory_problem(theirs))


def test_calibration_skips_the_disk_file_when_space_is_short(tmpfs: Mount) -> None:
    where = tmpfs("size=2m")
    rates, measured = _disk_or_assumed(where)
    assert not measured and rates.read_gbps > 0
    assert list(where.iterdir()) == []  # no half-written 64 MiB file left behind


# the real model -------------------------------------------------------------------------------


@pytest.mark.slow
def test_damaged_cache_serves_from_ram_and_cache_clear_resets_it(
    make_runtime, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    from warmstart.runtime.cli._main import main

    cache = tmp_path / "cache"
    (cache / "blobs").mkdir(parents=True)
    (cache / "blobs" / "cache.db").write_bytes(b"garbage" * 1000)
    with caplog.at_level(logging.WARNING):
        rt = make_runtime(cache_dir=cache)
        assert _answer(rt, "Say hello.")
        assert _answer(rt, "Say goodbye.")
    assert "disk" in rt.degraded() and "cache clear" in caplog.text
    assert rt.stats()["tiers"]["disk"]["degraded"] is True
    assert _warnings(caplog, "disk tier off") == 1  # said once, not per chunk
    rt.close()

    assert main(["cache", "clear", "--data-dir", str(tmp_path), "--cache-dir", str(cache)]) == 0
    again = make_runtime(cache_dir=cache)
    assert again.degraded() == {}
    assert _answer(again, "Say hello.")
    again.store.flush()
    assert again.stats()["tiers"]["disk"]["tokens"] > 0


@pytest.mark.slow
def test_read_only_at_start_then_writable_brings_the_tier_back(
    make_runtime, tmpfs: Mount, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    where = tmpfs("ro", "size=32m")
    with caplog.at_level(logging.WARNING):
        rt = make_runtime(cache_dir=where / "cache", disk_retry_s=0.3)
        assert _answer(rt, "Name a colour.")
    assert "disk" in rt.degraded()
    _remount(where, "rw")
    assert wait_for(lambda: rt.degraded() == {}, 30.0), rt.degraded()
    assert _warnings(caplog, "disk tier back") == 1
    assert _answer(rt, "Name a fruit.")
    rt.store.flush()
    assert rt.stats()["tiers"]["disk"]["tokens"] > 0


@pytest.mark.slow
def test_disk_full_mid_run_keeps_answering_and_recovers(
    make_runtime, tmpfs: Mount, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    where = tmpfs("size=24m")
    rt = make_runtime(cache_dir=where / "cache", disk_retry_s=0.3)
    assert _answer(rt, "Name a planet.")
    rt.store.flush()
    on_disk = rt.stats()["tiers"]["disk"]["tokens"]
    assert on_disk > 0 and rt.degraded() == {}

    filler = _fill(where)
    with caplog.at_level(logging.WARNING):
        assert _answer(rt, "Name a river in Europe and say why it matters.")
        rt.store.flush()
        assert wait_for(lambda: "disk" in rt.degraded(), 30.0)
        assert "full" in rt.degraded()["disk"]
        assert _answer(rt, "Name a mountain.")  # still answering from RAM
        filler.unlink()
        assert wait_for(lambda: rt.degraded() == {}, 30.0), rt.degraded()
    assert _warnings(caplog, "disk tier off") == 1
    rt.store.flush()
    # the chunks captured while the disk was full were written once it had room
    assert rt.stats()["tiers"]["disk"]["tokens"] > on_disk
    assert _answer(rt, "Name a lake.")


@pytest.mark.slow
def test_health_and_metrics_say_the_disk_tier_is_off(make_runtime, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient
    from warmstart.runtime.api import create_app

    cache = tmp_path / "cache"
    (cache / "blobs").mkdir(parents=True)
    (cache / "blobs" / "cache.db").write_bytes(b"garbage" * 1000)
    rt = make_runtime(cache_dir=cache)
    client = TestClient(create_app(rt.settings, rt), base_url="http://localhost")
    health = client.get("/health").json()
    assert health["status"] == "ok" and "disk" in health["degraded"]
    assert "warmstart_disk_tier_degraded 1.0" in client.get("/metrics").text
