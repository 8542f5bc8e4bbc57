import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from warmstart.runtime.errors import DiskFull
from warmstart.runtime.kvstore._disk import DiskTier
from warmstart.runtime.kvstore._figures import StoreStats
from warmstart.runtime.kvstore._pool import RamPool
from warmstart.runtime.kvstore._store import TieredStore

SLOT = 8192


def blob(seed: int, n: int = 6000) -> bytes:
    return random.Random(seed).randbytes(n)


def put(store: TieredStore, parent: bytes, start: int, tokens: list[int], data: bytes):  # type: ignore[no-untyped-def]
    """Keeps one chunk as a capture does: prepare_store, the bytes cut, complete_store."""
    end = start + len(tokens)
    plan = store.prepare_store(tokens, [end], lambda _n: len(data), parent=parent, start=start)
    for save in plan.saves:
        save.buffer[: len(data)] = np.frombuffer(data, dtype=np.uint8)
        save.nbytes = len(data)
    key = store.complete_store(plan)
    assert key is not None
    return store.ledger.get(key)


def make(tmp_path: Path, slots: int = 4, disk: bool = True, **kw: object) -> TieredStore:
    tier = DiskTier(tmp_path, "fp", 1, 1 << 30) if disk else None
    return TieredStore("fp", RamPool(slots * SLOT, SLOT), tier, **kw)  # type: ignore[arg-type]


def test_capture_then_read_from_ram_and_from_disk_in_a_new_store(tmp_path: Path) -> None:
    store = make(tmp_path)
    a = put(store, store.root, 0, [1, 2], blob(1))
    b = put(store, a.key, 2, [3, 4], blob(2))
    plan = store.prepare_load([1, 2, 3, 4, 5], [2, 4])
    assert [c.tier for c in plan.loads] == ["ram", "ram"]
    assert bytes(store.read(b)) == blob(2)  # type: ignore[arg-type]
    store.complete_load(plan)
    store.flush()
    store.close()
    again = make(tmp_path)
    plan = again.prepare_load([1, 2, 3, 4, 5], [2, 4])
    assert [c.tier for c in plan.loads] == ["disk", "disk"]
    assert bytes(again.read(plan.records[1])) == blob(2)  # type: ignore[arg-type]
    assert plan.records[1].tier == "ram"  # promoted on read
    again.complete_load(plan)
    again.close()


def test_identical_chunks_are_stored_once(tmp_path: Path) -> None:
    store = make(tmp_path)
    first = put(store, store.root, 0, [7, 7], blob(3))
    assert first.key in store
    assert put(store, store.root, 0, [7, 7], blob(3)) is first
    store.flush()
    assert store.stats().disk.chunks == 1
    store.close()


def test_pool_full_demotes_cold_chunks_that_are_on_disk(tmp_path: Path) -> None:
    store = make(tmp_path, slots=4, high_watermark=0.75, low_watermark=0.5, min_residency_s=0)
    parent, start = store.root, 0
    for i in range(8):
        rec = put(store, parent, start, [i], blob(i))
        store.flush()  # on disk, so it may leave RAM
        parent, start = rec.key, start + 1
    stats = store.stats()
    assert stats.ram.chunks <= 3 and stats.disk.chunks == 8
    assert stats.demotions >= 5
    # everything is still restorable, from one tier or the other
    plan = store.prepare_load([*range(8), 99], range(1, 9))
    assert len(plan.loads) == 8
    assert len(store.load(plan)) == 8
    store.complete_load(plan)
    store.close()


def test_without_disk_leaving_ram_is_eviction(tmp_path: Path) -> None:
    store = make(
        tmp_path, slots=2, disk=False, high_watermark=0.5, low_watermark=0.0, min_residency_s=0
    )
    a = put(store, store.root, 0, [1], blob(1))
    put(store, a.key, 1, [2], blob(2))
    put(store, store.root, 0, [5], blob(5))
    assert store.stats().evictions >= 1


def test_a_full_disk_degrades_to_ram_and_loses_nothing_in_ram(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make(tmp_path)
    assert store.disk is not None

    def full(*_a: object) -> None:
        raise DiskFull("the cache disk is full")

    monkeypatch.setattr(store.disk, "put", full)
    rec = put(store, store.root, 0, [1, 2], blob(1))
    store.flush()
    assert store.health.degraded and store.stats().disk_full == 1
    assert rec.tier == "ram" and bytes(store.read(rec)) == blob(1)  # type: ignore[arg-type]
    store.close()


def test_a_tail_stays_beside_the_longer_chunk(tmp_path: Path) -> None:
    # [0, 2) prefilled as one batch is not a prefix of [0, 4) prefilled as one batch:
    # the short one is what an identical short prompt restores
    store = make(tmp_path)
    tail = put(store, store.root, 0, [1, 2], blob(1))
    put(store, store.root, 0, [1, 2, 3, 4], blob(2))
    store.flush()
    assert tail.key in store
    assert store.prepare_load([1, 2, 9], [2]).records == (tail,)
    store.close()


def test_stats_count_what_is_on_disk_after_evictions(tmp_path: Path) -> None:
    """diskcache culls blobs to stay in budget; the stats must follow the files."""
    tier = DiskTier(tmp_path, "fp", 0, 64 << 10)  # room for a few 6 KB chunks only
    store = TieredStore("fp", RamPool(4 * SLOT, SLOT), tier, min_residency_s=0)  # type: ignore[arg-type]
    parent = store.root
    for i in range(40):
        parent = put(store, parent, 2 * i, [i, i], blob(i)).key
        store.flush()
    stats = store.stats().disk
    files = [p for p in (tmp_path / "blobs").rglob("*.val")]
    on_disk = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert stats.chunks == len(tier.present()) < 40
    assert stats.chunks >= len(files)
    assert stats.tokens == 2 * stats.chunks
    assert store.stats().culled == 40 - stats.chunks  # what the budget evicted
    assert stats.used_bytes >= on_disk * 0.5 and stats.used_bytes < 4 * on_disk + (1 << 20)
    for key in list(tier.present()):
        tier.delete(key)
    emptied = store.stats().disk
    assert emptied.chunks == 0 and emptied.tokens == 0 and emptied.kv_bytes == 0
    store.close()


def test_a_load_plan_says_where_each_chunk_is_and_where_disk_reads_land(tmp_path: Path) -> None:
    store = make(tmp_path)
    parent, start = store.root, 0
    for i in range(3):
        parent = put(store, parent, start, [i, i], blob(i)).key
        start += 2
    store.flush()
    store.close()
    again = make(tmp_path)
    # room in the staging memory for two of the three disk chunks, one after another
    plan = again.prepare_load([0, 0, 1, 1, 2, 2, 9], [2, 4, 6], staging_bytes=2 * 6000 + 10)
    assert [(c.start, c.end, c.tier, c.offset) for c in plan.loads] == [
        (0, 2, "disk", 0),
        (2, 4, "disk", 6000),
        (4, 6, "disk", None),
    ]
    assert plan.end == 6 and plan.nbytes == 18000 and plan.slowest == "disk"
    staging = np.zeros(2 * 6000 + 10, dtype=np.uint8)
    blobs = again.load(plan, staging)
    assert [bytes(b) for b in blobs] == [blob(0), blob(1), blob(2)]
    assert bytes(staging[6000:12000]) == blob(1)  # landed where the plan said
    # the one without staging room went to a pool slot: read means promoted
    assert [r.tier for r in plan.records] == ["disk", "disk", "ram"]
    assert plan.tokens_by_tier(3) == {"disk": 6}
    assert plan.to_promote(2) == list(plan.records[:2])
    again.complete_load(plan)
    again.close()


def test_a_planned_chunk_is_pinned_until_the_load_completes(tmp_path: Path) -> None:
    store = make(tmp_path, disk=False)
    rec = put(store, store.root, 0, [1, 2], blob(1))
    plan = store.prepare_load([1, 2, 3], [2])
    assert store.drop([rec.key]) == 1
    assert store.load(plan) and rec.key in store.ledger  # doomed, still readable
    store.complete_load(plan)
    assert rec.key not in store.ledger  # gone with its last pin
    store.close()


def test_a_store_plan_keeps_the_prefix_up_to_the_first_failed_cut(tmp_path: Path) -> None:
    store = make(tmp_path, slots=8)
    tokens = [1, 2, 3, 4, 5, 6]
    plan = store.prepare_store(tokens, [2, 4, 6], lambda n: 3000 * n)
    assert [(s.start, s.end) for s in plan.saves] == [(0, 2), (2, 4), (4, 6)]
    assert all(s.slot is not None for s in plan.saves)  # room reserved in the pool
    for save, data in zip(plan.saves, (blob(1), None, blob(3)), strict=True):
        if data is not None:
            save.buffer[: len(data)] = np.frombuffer(data, dtype=np.uint8)
            save.nbytes = len(data)
    leaf = store.complete_store(plan)
    assert leaf == plan.keys[0]  # the second cut failed: the third is not kept either
    store.flush()
    assert store.stats().chunks == 1 and store.stats().ram.chunks == 1
    assert store.pool is not None and store.pool.used_slots == 1  # the rest gave room back
    again = store.prepare_store(tokens, [2, 4, 6], lambda n: 3000 * n)
    assert [(s.start, s.end) for s in again.saves] == [(2, 4), (4, 6)]  # only what it lacks
    assert store.complete_store(again, ok=False) is None
    assert store.pool.used_slots == 1 and store.stats().chunks == 1
    store.close()


def test_a_store_plans_saves_come_in_runs_of_adjacent_chunks(tmp_path: Path) -> None:
    """A capture reads each run's cells from the context at once (Engine.snapshot), so
    a chunk the store has already (here the second) is neither read nor saved."""
    store = make(tmp_path, slots=8)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    first = store.prepare_store(tokens, [2, 4], lambda n: 3000 * n)
    assert [[(s.start, s.end) for s in run] for run in first.runs()] == [[(0, 2), (2, 4)]]
    store.complete_store(first, ok=False)
    put(store, first.keys[0], 2, [3, 4], blob(1))
    plan = store.prepare_store(tokens, [2, 4, 6, 8], lambda n: 3000 * n)
    runs = [[(s.start, s.end) for s in run] for run in plan.runs()]
    assert runs == [[(0, 2)], [(4, 6), (6, 8)]]
    store.complete_store(plan, ok=False)
    store.close()


def test_a_write_waits_while_a_request_is_computed(tmp_path: Path) -> None:
    """Compressing a chunk beside the engine's threads would slow their steps: a write
    waits while the engine is busy with a request (at most HOLD_S), then goes."""
    store = make(tmp_path)
    try:
        store.hold(True)
        record = put(store, store.root, 0, [1, 2], blob(9))
        time.sleep(0.3)
        assert not record.on_disk
        store.hold(False)
        assert wait_until(lambda: record.on_disk)
        # a flush does not wait for the engine: the writes go at once
        store.hold(True)
        other = put(store, store.root, 0, [3, 4], blob(10))
        assert store.flush(timeout=1.5) and other.on_disk
    finally:
        store.close()


def test_the_startup_prewarm_reads_nothing_while_a_request_is_computed(tmp_path: Path) -> None:
    """The prewarm's disk reads and decompression would take a core from a request's
    steps: in the background it waits while the engine is busy with a request, then
    goes; a client's own prewarm goes at once; close()'s stop ends the wait."""
    store = make(tmp_path)
    a = put(store, store.root, 0, [1, 2], blob(11))
    b = put(store, a.key, 2, [3, 4], blob(12))
    store.flush()
    store.close()
    again = make(tmp_path)
    try:
        chain = again.chain(b.key)
        assert [r.tier for r in chain] == ["disk", "disk"]
        again.hold(True)
        done: list[int] = []
        worker = threading.Thread(
            target=lambda: done.append(again.promote(chain, make_room=False, background=True))
        )
        worker.start()
        time.sleep(0.3)
        assert not done and [r.tier for r in chain] == ["disk", "disk"]
        again.hold(False)
        worker.join(10)
        assert done == [4] and [r.tier for r in chain] == ["ram", "ram"]
    finally:
        again.close()
    third = make(tmp_path)
    try:
        chain = third.chain(b.key)
        third.hold(True)
        assert third.promote(chain[:1], make_room=False) == 2  # asked for: at once
        stop = threading.Event()
        worker = threading.Thread(
            target=lambda: done.append(
                third.promote(chain, make_room=False, stop=stop, background=True)
            )
        )
        worker.start()
        time.sleep(0.2)
        stop.set()
        worker.join(10)
        assert not worker.is_alive() and done[-1] == 0 and chain[1].tier == "disk"
    finally:
        third.close()


def wait_until(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.02)
    return bool(predicate())


def test_a_chunk_waiting_for_its_write_with_the_pool_full_is_still_restorable(
    tmp_path: Path,
) -> None:
    """Under load, writes wait (HOLD_S each) and every pool slot may hold a chunk not yet
    on disk, which cannot leave RAM: a chunk captured then is kept in a buffer of its
    own until its write lands, and a prompt that shares it restores it meanwhile
    (before, it was in no tier until then, and the next turn recomputed it)."""
    store = make(tmp_path, slots=1, min_residency_s=0)
    try:
        store.hold(True)
        parent, start, records = store.root, 0, []
        for i in range(3):
            records.append(put(store, parent, start, [i], blob(20 + i)))
            parent, start = records[-1].key, start + 1
        assert not any(r.on_disk for r in records) and records[1].slot is None
        plan = store.prepare_load([0, 1, 2, 99], [1, 2, 3])
        assert [c.tier for c in plan.loads] == ["ram"] * 3
        assert [bytes(b) for b in store.load(plan)] == [blob(20 + i) for i in range(3)]
        store.complete_load(plan)
        store.hold(False)
        assert store.flush(10) and all(r.on_disk for r in records)
        assert records[1].tier == "disk" and records[1].held is None  # its buffer went
    finally:
        store.close()


def test_a_disk_chunk_larger_than_a_slot_is_read_into_a_buffer_of_its_own(
    tmp_path: Path,
) -> None:
    """A chunk written under other settings (longer chunks, before a recalibration)
    can be larger than today's pool slot: it is read whole, not dropped as corrupt."""
    big = blob(30, 2 * SLOT)
    store = TieredStore("fp", None, DiskTier(tmp_path, "fp", 1, 1 << 30))
    record = put(store, store.root, 0, [1, 2], big)
    assert store.flush(10) and record.on_disk
    store.close()
    again = make(tmp_path)
    try:
        plan = again.prepare_load([1, 2, 3], [2])
        assert [c.tier for c in plan.loads] == ["disk"]
        assert [bytes(b) for b in again.load(plan)] == [big]
        again.complete_load(plan)
        assert again.stats().corrupt == 0 and again.stats().chunks == 1
    finally:
        again.close()


def test_the_store_figures_keep_their_json_shape(tmp_path: Path) -> None:
    """The ``store`` object of /v1/warmstart/stats is StoreStats.to_json: these keys, in
    this order (what the store's dict said before it was a typed value)."""
    store = make(tmp_path)
    try:
        put(store, store.root, 0, [1, 2], blob(1))
        store.flush()
        raw = store.stats().to_json()
    finally:
        store.close()
    assert list(raw) == [
        *("chunks", "ram", "disk", "pending_writes", "evictions", "demotions", "corrupt"),
        *("disk_full", "written", "dropped", "culled", "disk_unavailable", "pressure_events"),
        "returned_bytes",
    ]
    assert list(raw["ram"]) == [
        *("chunks", "tokens", "used_bytes", "capacity_bytes", "limit_bytes", "resident_bytes"),
        *("returnable", "slots", "memory"),
    ]
    assert list(raw["disk"]) == [
        *("chunks", "tokens", "kv_bytes", "used_bytes", "degraded", "degraded_reason"),
    ]
    assert raw["chunks"] == raw["ram"]["chunks"] == raw["disk"]["chunks"] == raw["written"] == 1
    assert StoreStats.from_json(raw).to_json() == raw
