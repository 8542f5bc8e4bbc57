"""What the store relies on when a chunk's bytes move through each tier: the disk tier
addressed by chunk key (``put``/``read_into``/``delete``), the RAM pool by slot (the
store reserves one, the engine cuts into its memory, ``set_length`` says how much)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from warmstart.runtime.errors import CacheError
from warmstart.runtime.kvstore._disk import DiskTier
from warmstart.runtime.kvstore._index import IndexRow
from warmstart.runtime.kvstore._pool import RamPool

SLOT = 16384


def row(i: int, nbytes: int) -> IndexRow:
    return IndexRow(bytes([i]) * 16, b"p" * 16, 0, (i, i + 1), nbytes)


def payload(i: int, n: int = 6000) -> bytes:
    return random.Random(i).randbytes(n)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[DiskTier]:
    tier = DiskTier(tmp_path, "fp", 1, 1 << 30)
    yield tier
    tier.close()


def read(disk: DiskTier, key: bytes, n: int = SLOT) -> bytes | None:
    out = np.empty(n, dtype=np.uint8)
    got = disk.read_into(key, out)
    return None if got is None else out[:got].tobytes()


def test_what_is_put_reads_back_byte_for_byte(disk: DiskTier) -> None:
    key = disk.put(row(1, 6000), payload(1))
    assert read(disk, key) == payload(1)


def test_chunks_do_not_clobber_each_other(disk: DiskTier) -> None:
    keys = [disk.put(row(i, 5000 + i), payload(i, 5000 + i)) for i in range(3)]
    assert len(set(keys)) == 3
    for i, key in enumerate(keys):
        assert read(disk, key) == payload(i, 5000 + i)


def test_a_deleted_chunk_is_gone_and_deleting_again_is_harmless(disk: DiskTier) -> None:
    key = disk.put(row(2, 6000), payload(2))
    disk.delete(key)
    assert read(disk, key) is None
    disk.delete(key)
    assert read(disk, key) is None


def test_bytes_that_do_not_fit_the_destination_are_refused(disk: DiskTier) -> None:
    key = disk.put(row(3, 6000), payload(3))
    with pytest.raises(CacheError):
        read(disk, key, n=100)


def test_a_memoryview_payload_is_kept_as_its_bytes(disk: DiskTier) -> None:
    """The write-through hands the disk tier a pool slot's memory, not bytes."""
    source = np.frombuffer(payload(4), dtype=np.uint8)
    key = disk.put(row(4, source.nbytes), source.data)
    assert read(disk, key) == payload(4)


def test_pool_slots_hold_their_own_bytes_until_released() -> None:
    pool = RamPool(2 * SLOT, SLOT)
    slots = [pool.alloc(), pool.alloc()]
    assert None not in slots and pool.alloc() is None  # full: a return value
    for i, slot in enumerate(slots):
        assert slot is not None
        pool.view(slot)[:6000] = np.frombuffer(payload(i), dtype=np.uint8)
        pool.set_length(slot, 6000)
    assert [bytes(pool.view(s, 6000)) for s in slots if s is not None] == [payload(0), payload(1)]
    with pytest.raises(ValueError):
        pool.set_length(0, SLOT + 1)  # bigger than a slot
    pool.release(slots[0])  # type: ignore[arg-type]
    assert pool.alloc() == slots[0]
