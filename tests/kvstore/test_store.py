import random
from pathlib import Path

import numpy as np
import pytest
from warmstart.runtime.errors import DiskFull
from warmstart.runtime.kvstore._disk import DiskTier
from warmstart.runtime.kvstore._keys import chunk_key
from warmstart.runtime.kvstore._pool import RamPool
from warmstart.runtime.kvstore._store import TieredStore

SLOT = 8192


def blob(seed: int, n: int = 6000) -> bytes:
    return random.Random(seed).randbytes(n)


def put(store: TieredStore, parent: bytes, start: int, tokens: list[int], data: bytes):  # type: ignore[no-untyped-def]
    res = store.reserve(len(data))
    res.buffer[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return store.commit(res, chunk_key(parent, tokens), parent, start, tokens, len(data))


def make(tmp_path: Path, slots: int = 4, disk: bool = True, **kw: object) -> TieredStore:
    tier = DiskTier(tmp_path, "fp", 1, 1 << 30) if disk else None
    return TieredStore("fp", RamPool(slots * SLOT, SLOT), tier, **kw)  # type: ignore[arg-type]


def test_capture_then_read_from_ram_and_from_disk_in_a_new_store(tmp_path: Path) -> None:
    store = make(tmp_path)
    a = put(store, store.root, 0, [1, 2], blob(1))
    b = put(store, a.key, 2, [3, 4], blob(2))
    hits = store.lookup([1, 2, 3, 4, 5], [2, 4])
    assert [h.record.tier for h in hits] == ["ram", "ram"]
    assert bytes(store.read(b)) == blob(2)  # type: ignore[arg-type]
    store.release(hits)
    store.flush()
    store.close()
    again = make(tmp_path)
    hits = again.lookup([1, 2, 3, 4, 5], [2, 4])
    assert [h.record.tier for h in hits] == ["disk", "disk"]
    assert bytes(again.read(hits[1].record)) == blob(2)  # type: ignore[arg-type]
    assert hits[1].record.tier == "ram"  # promoted on read
    again.release(hits)
    again.close()


def test_identical_chunks_are_stored_once(tmp_path: Path) -> None:
    store = make(tmp_path)
    first = put(store, store.root, 0, [7, 7], blob(3))
    assert first.key in store
    assert put(store, store.root, 0, [7, 7], blob(3)) is first
    store.flush()
    assert store.stats()["disk"]["chunks"] == 1
    store.close()


def test_pool_full_demotes_cold_chunks_that_are_on_disk(tmp_path: Path) -> None:
    store = make(tmp_path, slots=4, high_watermark=0.75, low_watermark=0.5, min_residency_s=0)
    parent, start = store.root, 0
    for i in range(8):
        rec = put(store, parent, start, [i], blob(i))
        store.flush()  # on disk, so it may leave RAM
        parent, start = rec.key, start + 1
    stats = store.stats()
    assert stats["ram"]["chunks"] <= 3 and stats["disk"]["chunks"] == 8
    assert stats["demotions"] >= 5
    # everything is still restorable, from one tier or the other
    hits = store.lookup([*range(8), 99], range(1, 9))
    assert len(hits) == 8
    assert all(store.read(h.record) is not None for h in hits)
    store.release(hits)
    store.close()


def test_without_disk_leaving_ram_is_eviction(tmp_path: Path) -> None:
    store = make(
        tmp_path, slots=2, disk=False, high_watermark=0.5, low_watermark=0.0, min_residency_s=0
    )
    a = put(store, store.root, 0, [1], blob(1))
    put(store, a.key, 1, [2], blob(2))
    put(store, store.root, 0, [5], blob(5))
    assert store.stats()["evictions"] >= 1


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
    assert store.disk_degraded and store.stats()["disk_full"] == 1
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
    assert [h.record for h in store.lookup([1, 2, 9], [2])] == [tail]
    store.close()


def test_stats_count_what_is_on_disk_after_evictions(tmp_path: Path) -> None:
    """diskcache culls blobs to stay in budget; the stats must follow the files."""
    tier = DiskTier(tmp_path, "fp", 0, 64 << 10)  # room for a few 6 KB chunks only
    store = TieredStore("fp", RamPool(4 * SLOT, SLOT), tier, min_residency_s=0)  # type: ignore[arg-type]
    parent = store.root
    for i in range(40):
        parent = put(store, parent, 2 * i, [i, i], blob(i)).key
        store.flush()
    stats = store.stats()["disk"]
    files = [p for p in (tmp_path / "blobs").rglob("*.val")]
    on_disk = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert stats["chunks"] == len(tier.present()) < 40
    assert stats["chunks"] >= len(files)
    assert stats["tokens"] == 2 * stats["chunks"]
    assert stats["used_bytes"] >= on_disk * 0.5 and stats["used_bytes"] < 4 * on_disk + (1 << 20)
    for key in list(tier.present()):
        tier.delete(key)
    emptied = store.stats()["disk"]
    assert emptied["chunks"] == 0 and emptied["tokens"] == 0 and emptied["kv_bytes"] == 0
    store.close()
