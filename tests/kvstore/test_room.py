"""Room in the RAM pool (runtime/kvstore/_room.py) over plain records: the watermarks,
who leaves first, what leaving means with and without a copy on disk, and the limit
memory pressure sets. No disk, no model."""

from __future__ import annotations

import threading

from warmstart.runtime.kvstore._ledger import Ledger, Record
from warmstart.runtime.kvstore._pool import RamPool
from warmstart.runtime.kvstore._room import RamRoom

SLOT = 8192


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(slots: int = 4, high: float = 1.0, low: float = 0.5) -> tuple[RamRoom, Ledger, Clock]:
    clock = Clock()
    ledger = Ledger(clock)
    room = RamRoom(RamPool(slots * SLOT, SLOT), ledger, threading.RLock(), high, low, 0.0)
    return room, ledger, clock


def keep(room: RamRoom, ledger: Ledger, clock: Clock, i: int, on_disk: bool) -> Record:
    """A chunk of tokens [i, i + 1) in a slot of its own, used at ``clock`` + i."""
    slot = room.alloc(1000)
    assert slot is not None
    room.pool.set_length(slot, 1000)
    clock.now += 1
    record = Record(bytes([i]) * 16, b"p" * 16, i, (i,), 1000, slot=slot, on_disk=on_disk)
    return ledger.add(record)


def test_a_full_pool_demotes_the_coldest_down_to_the_low_watermark() -> None:
    room, ledger, clock = make(slots=4)
    records = [keep(room, ledger, clock, i, on_disk=i % 2 == 1) for i in range(4)]
    assert room.alloc(1000) is not None  # full: room was made
    # the first chunk (a system prompt) is kept longest; 1 and 2 were the coldest after it
    assert [r.slot is not None for r in records] == [True, False, False, True]
    assert records[1].key in ledger and records[2].key not in ledger  # on disk: kept
    assert (room.demotions, room.evictions) == (2, 1)


def test_pinned_chunks_never_leave_and_a_chunk_bigger_than_a_slot_gets_none() -> None:
    room, ledger, clock = make(slots=2)
    records = [keep(room, ledger, clock, i, on_disk=True) for i in range(2)]
    ledger.pin(records)
    assert room.alloc(1000) is None and all(r.slot is not None for r in records)
    ledger.unpin(records)
    assert room.alloc(SLOT + 1) is None  # a chunk cut with other settings
    assert room.alloc(1000) is not None


def test_pressure_lowers_the_limit_gives_pages_back_and_grows_again() -> None:
    room, ledger, clock = make(slots=4)
    records = [keep(room, ledger, clock, i, on_disk=True) for i in range(4)]
    resident, limit, capacity = room.figures()
    assert limit == capacity == 4 * SLOT and resident > 0
    freed = room.shrink(SLOT)
    assert freed > 0 and room.figures()[1] == SLOT and room.pool.used_slots == 1
    assert records[0].slot is not None  # the first chunk stays longest
    assert (room.pressure_events, room.returned_bytes) == (1, freed)
    assert not room.may_fill(make_room=False)  # at its (lowered) limit
    room.shrink(0)
    assert not room.may_fill(make_room=True)  # memory short: a read would land nowhere
    room.grow(2 * SLOT)
    room.grow(SLOT)  # never lowered by a grow
    assert room.figures()[1] == 2 * SLOT and room.may_fill(make_room=False)
    room.grow(100 * SLOT)
    assert room.figures()[1] == capacity


def test_its_figures_count_the_chunks_in_the_pool() -> None:
    room, ledger, clock = make(slots=4)
    for i in range(3):
        keep(room, ledger, clock, i, on_disk=True)
    ledger.add(Record(b"d" * 16, b"p" * 16, 9, (9, 9), 5000, on_disk=True))  # disk only
    figures = room.stats()
    assert (figures.chunks, figures.tokens, figures.used_bytes) == (3, 3, 3000)
    assert figures.slots == 4 and figures.capacity_bytes == 4 * SLOT
    assert figures.memory == room.pool.memory_kind
