"""The RAM pool gives memory back under pressure: the watcher's logic with a fake
meminfo reader, and the pool's pages really leaving the process."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import numpy as np
import pytest
from warmstart.runtime.kvstore._disk import DiskTier
from warmstart.runtime.kvstore._pool import RamPool
from warmstart.runtime.kvstore._pressure import MemoryWatcher, next_limit, read_available
from warmstart.runtime.kvstore._store import TieredStore

from tests.conftest import vm_rss

MiB = 1 << 20
SLOT = 64 * 1024


class FakeMeminfo:
    """MemAvailable as the test says; counts the looks."""

    def __init__(self, available: int) -> None:
        self.available, self.reads = available, 0

    def __call__(self) -> int:
        self.reads += 1
        return self.available


def fill(store: TieredStore, n: int) -> list[bytes]:
    """``n`` chained chunks of SLOT bytes each, written through; their keys."""
    keys, parent = [], store.root
    for i in range(n):
        data = random.Random(i).randbytes(SLOT)
        plan = store.prepare_store([i], [i + 1], lambda _n: SLOT, parent=parent, start=i)
        (save,) = plan.saves
        save.buffer[:SLOT] = np.frombuffer(data, dtype=np.uint8)
        save.nbytes = SLOT
        key = store.complete_store(plan)
        assert key is not None
        keys.append(key)
        parent = key
    store.flush()
    return keys


def make(tmp_path: Path, slots: int = 8, disk: bool = True) -> TieredStore:
    tier = DiskTier(tmp_path, "fp", 0, 1 << 30) if disk else None
    return TieredStore(
        "fp",
        RamPool(slots * SLOT, SLOT),
        tier,
        high_watermark=1.0,
        low_watermark=0.9,
        min_residency_s=0,
    )


def test_next_limit() -> None:
    # below the floor: what the pool holds, less the shortfall
    assert next_limit(900, 1000, resident=500, limit=800, capacity=800) == 400
    assert next_limit(900, 1000, resident=900, limit=600, capacity=800) == 500
    assert next_limit(100, 1000, resident=500, limit=800, capacity=800) == 0
    # above: half the room, never lowered, never past the capacity
    assert next_limit(1200, 1000, resident=100, limit=0, capacity=800) == 200
    assert next_limit(1200, 1000, resident=100, limit=700, capacity=800) == 700
    assert next_limit(9000, 1000, resident=100, limit=0, capacity=800) == 800


def test_pressure_demotes_to_disk_gives_pages_back_and_grows_again(tmp_path: Path) -> None:
    store = make(tmp_path)
    keys = fill(store, 8)
    resident_full, _, capacity = store.ram.figures()
    assert resident_full == 8 * SLOT == capacity
    meminfo = FakeMeminfo(available=10 * MiB)
    watcher = MemoryWatcher(store.ram, floor_bytes=10 * MiB + 5 * SLOT, read=meminfo)

    watcher.check()  # 5 slots short: the pool keeps 3
    resident, limit, _ = store.ram.figures()
    assert limit == 3 * SLOT and resident == 3 * SLOT
    stats = store.stats()
    assert stats.ram.chunks == 3 and stats.disk.chunks == 8
    assert stats.pressure_events == 1 and stats.returned_bytes == 5 * SLOT
    assert watcher.under_pressure
    # the coldest went (the first chunk, a system prompt, is kept longest)
    plan = store.prepare_load(list(range(9)), range(1, 9))
    assert [c.tier for c in plan.loads][:1] == ["ram"]
    assert [c.tier for c in plan.loads].count("disk") == 5
    store.complete_load(plan)

    meminfo.available += 5 * SLOT  # what the pool gave back
    watcher.check()  # at the floor: neither shrinks nor grows
    assert store.stats().pressure_events == 1 and store.ram.figures()[1] == 3 * SLOT
    meminfo.available -= 2 * SLOT  # another program takes more
    watcher.check()
    assert store.stats().pressure_events == 2 and store.ram.figures()[:2] == (SLOT, SLOT)

    demoted = [r for r in store.chain(keys[-1]) if r.tier == "disk"]
    store.ram.shrink(0)
    assert store.promote(demoted) == 0  # no room at all: nothing read for nothing
    meminfo.available = 10 * MiB + 5 * SLOT + 32 * SLOT  # memory is back
    watcher.check()
    assert store.ram.figures()[1] == capacity and not watcher.under_pressure
    # the demoted chunks answer from disk, and come back into RAM when read
    record = store.chain(keys[-1])[-1]
    assert record.tier == "disk"
    assert bytes(store.read(record)) == random.Random(7).randbytes(SLOT)  # type: ignore[arg-type]
    assert record.tier == "ram"
    store.close()


def test_without_the_disk_tier_the_demoted_chunks_are_dropped(tmp_path: Path) -> None:
    store = make(tmp_path, disk=False)
    fill(store, 8)
    MemoryWatcher(store.ram, floor_bytes=MiB + 8 * SLOT, read=FakeMeminfo(MiB)).check()
    stats = store.stats()
    assert stats.ram.chunks == 0 and stats.chunks == 0  # a later recompute
    assert stats.evictions == 8 and stats.ram.resident_bytes == 0
    store.close()


def test_a_chunk_being_read_stays_until_released(tmp_path: Path) -> None:
    store = make(tmp_path)
    fill(store, 4)
    plan = store.prepare_load(list(range(5)), range(1, 5))  # pinned, as a restore does
    MemoryWatcher(store.ram, floor_bytes=2 * MiB, read=FakeMeminfo(MiB)).check()
    assert all(r.tier == "ram" for r in plan.records)
    store.complete_load(plan)
    store.ram.shrink(0)
    assert store.stats().ram.chunks == 0
    store.close()


def test_floor_zero_or_no_reading_does_nothing(tmp_path: Path) -> None:
    store = make(tmp_path)
    fill(store, 4)
    MemoryWatcher(store.ram, floor_bytes=0, read=FakeMeminfo(0)).check()
    MemoryWatcher(store.ram, floor_bytes=1 << 40, read=lambda: None).check()
    assert store.stats().ram.chunks == 4 and store.stats().pressure_events == 0
    store.close()


def test_the_watcher_thread_looks_every_interval_and_stops_on_close(tmp_path: Path) -> None:
    store = make(tmp_path)
    fill(store, 8)
    meminfo = FakeMeminfo(MiB)
    watcher = MemoryWatcher(store.ram, floor_bytes=MiB + 8 * SLOT, interval_s=0.01, read=meminfo)
    watcher.start()
    try:
        for _ in range(500):
            if store.stats().ram.chunks == 0:
                break
            threading.Event().wait(0.01)
        assert store.stats().ram.chunks == 0
    finally:
        watcher.close()
    assert not watcher.thread.is_alive()
    reads = meminfo.reads
    threading.Event().wait(0.05)
    assert meminfo.reads == reads
    store.close()


def test_read_available_is_the_kernels_figure() -> None:
    available = read_available()
    assert available is not None and available > 0


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmRSS is Linux's")
def test_given_back_pages_leave_the_process() -> None:
    slot = 4 * MiB
    pool = RamPool(16 * slot, slot)
    assert pool.returnable
    slots = [pool.alloc() for _ in range(16)]
    for s in slots:
        assert s is not None
        pool.view(s)[:] = 1  # committed now
        pool.set_length(s, slot)
    before = vm_rss()
    assert pool.resident_bytes == 64 * MiB
    for s in slots:
        pool.release(s)  # Free, still resident: reused first
    assert pool.resident_bytes == 64 * MiB
    assert pool.give_back() == 64 * MiB
    after = vm_rss()
    assert pool.resident_bytes == 0
    assert before - after >= 48 * MiB, (before, after)
    # the pages were discarded, not just unmapped (as a shared mapping's would be): a
    # given-back slot reads as fresh zero pages and works again
    again = pool.alloc()
    assert again is not None and int(pool.view(again)[:16].sum()) == 0
