"""The Tier contract (runtime/kvstore/_tier.py), the same tests over the RAM pool and
the disk tier: what the transfer worker relies on when it moves a chunk's bytes."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from warmstart.runtime.errors import CacheError
from warmstart.runtime.kvstore._disk import DiskTier
from warmstart.runtime.kvstore._index import IndexRow
from warmstart.runtime.kvstore._pool import RamPool
from warmstart.runtime.kvstore._tier import Tier

SLOT = 16384


def row(i: int, nbytes: int) -> IndexRow:
    return IndexRow(bytes([i]) * 16, b"p" * 16, 0, (i, i + 1), nbytes)


def payload(i: int, n: int = 6000) -> bytes:
    return random.Random(i).randbytes(n)


@pytest.fixture(params=["ram", "disk"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tier[Any]]:
    if request.param == "ram":
        yield RamPool(4 * SLOT, SLOT)
        return
    disk = DiskTier(tmp_path, "fp", 1, 1 << 30)
    yield disk
    disk.close()


def read(tier: Tier[Any], where: Any, n: int = SLOT) -> bytes | None:
    out = np.empty(n, dtype=np.uint8)
    got = tier.read_into(where, out)
    return None if got is None else out[:got].tobytes()


def test_what_is_put_reads_back_byte_for_byte(tier: Tier[Any]) -> None:
    where = tier.put(row(1, 6000), payload(1))
    assert where is not None
    assert read(tier, where) == payload(1)


def test_chunks_do_not_clobber_each_other(tier: Tier[Any]) -> None:
    places = [tier.put(row(i, 5000 + i), payload(i, 5000 + i)) for i in range(3)]
    assert len(set(places)) == 3
    for i, where in enumerate(places):
        assert read(tier, where) == payload(i, 5000 + i)


def test_a_deleted_chunk_is_gone_and_deleting_again_is_harmless(tier: Tier[Any]) -> None:
    where = tier.put(row(2, 6000), payload(2))
    tier.delete(where)
    assert read(tier, where) is None
    tier.delete(where)
    assert read(tier, where) is None


def test_bytes_that_do_not_fit_the_destination_are_refused(tier: Tier[Any]) -> None:
    where = tier.put(row(3, 6000), payload(3))
    with pytest.raises(CacheError):
        read(tier, where, n=100)


def test_a_memoryview_payload_is_kept_as_its_bytes(tier: Tier[Any]) -> None:
    """The write-through hands the disk tier a pool slot's memory, not bytes."""
    source = np.frombuffer(payload(4), dtype=np.uint8)
    where = tier.put(row(4, source.nbytes), source.data)
    assert read(tier, where) == payload(4)


def test_the_pool_refuses_what_it_has_no_room_for() -> None:
    pool = RamPool(2 * SLOT, SLOT)
    assert pool.put(row(1, SLOT + 1), payload(1, SLOT + 1)) is None  # bigger than a slot
    assert pool.put(row(1, 10), payload(1, 10)) is not None
    assert pool.put(row(2, 10), payload(2, 10)) is not None
    assert pool.put(row(3, 10), payload(3, 10)) is None  # full: a return value
