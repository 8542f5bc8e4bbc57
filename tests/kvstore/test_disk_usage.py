"""The disk tier counts what it holds as it writes, culls and deletes: the figures a
stats scrape reads equal the bytes on disk, and reading them lists nothing."""

import os
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from warmstart.runtime.kvstore._disk import DiskTier
from warmstart.runtime.kvstore._figures import DiskFigures
from warmstart.runtime.kvstore._pool import RamPool
from warmstart.runtime.kvstore._store import TieredStore

SLOT = 64 << 10


def walked(directory: Path) -> int:
    """The oracle: allocated bytes of every file under ``directory``."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            info = os.lstat(os.path.join(root, name))
            total += info.st_blocks * 512 or info.st_size
    return total


def fill(
    store: TieredStore, n: int, size: int = 40 << 10, each: Callable[[], None] = lambda: None
) -> list[bytes]:
    """``n`` chained chunks of incompressible bytes (files, not SQLite values); ``each``
    is called after each one is written."""
    keys, parent = [], store.root
    for i in range(n):
        data = np.frombuffer(random.Random(i).randbytes(size), dtype=np.uint8)
        plan = store.prepare_store([i, i], [2 * i + 2], lambda _n: size, parent, 2 * i)
        for save in plan.saves:
            save.buffer[:size] = data
            save.nbytes = size
        key = store.complete_store(plan)
        assert key is not None
        store.flush()
        each()
        keys.append(key)
        parent = key
    return keys


def usage(store: TieredStore) -> DiskFigures:
    return store.stats().disk


def test_disk_usage_equals_the_bytes_on_disk_after_writes_culls_and_deletes(
    tmp_path: Path,
) -> None:
    tier = DiskTier(tmp_path, "fp", 0, 1 << 20)  # room for about 25 chunks of 40 KB
    store = TieredStore("fp", RamPool(4 * SLOT, SLOT), tier, min_residency_s=0)
    keys = fill(store, 40)
    after_culls = usage(store)
    assert after_culls.used_bytes == walked(tmp_path)
    present = tier.present()
    assert 0 < after_culls.chunks == len(present) < 40  # diskcache culled the oldest
    assert after_culls.tokens == 2 * len(present)
    assert after_culls.kv_bytes == len(present) * (40 << 10)
    culled = [store.ledger.get(k) for k in keys if k not in present]
    assert not any(r is not None and r.on_disk for r in culled)  # the store was told

    survivor = next(k for k in keys if k in present)
    record = store.ledger.get(survivor)
    assert record is not None and tier.get(survivor) is not None  # a read writes LRU times
    assert usage(store).used_bytes == walked(tmp_path)

    store.drop(sorted(present)[: len(present) // 2])
    store.flush()
    dropped = usage(store)
    assert dropped.used_bytes == walked(tmp_path)
    assert dropped.chunks == len(tier.present()) == len(present) - len(present) // 2
    store.close()

    again = DiskTier(tmp_path, "fp", 0, 1 << 20)  # counted once at open
    assert again.usage.used_bytes == walked(tmp_path)
    assert again.usage.chunks == dropped.chunks
    again.clear()
    assert again.usage.chunks == 0 and again.usage.used_bytes == walked(tmp_path)
    again.close()


def test_stats_list_no_keys_and_walk_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = DiskTier(tmp_path, "fp", 0, 1 << 30)
    store = TieredStore("fp", RamPool(4 * SLOT, SLOT), tier)
    fill(store, 3)

    def listing(*_args: object, **_kw: object) -> None:
        raise AssertionError("a stats read listed the cache")

    monkeypatch.setattr(tier, "present", listing)
    monkeypatch.setattr(tier._blobs, "iterkeys", listing)
    monkeypatch.setattr(os, "walk", listing)
    monkeypatch.setattr(os, "scandir", listing)
    disk = usage(store)
    assert disk.chunks == 3 and disk.tokens == 6
    monkeypatch.undo()
    assert disk.used_bytes == walked(tmp_path)
    store.close()
