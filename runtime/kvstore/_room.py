"""Room in the RAM pool: which chunks leave it, when, and how far.

Being full is the pool's normal state: a slot wanted at the high watermark first
demotes the coldest chunks down to the low one. Under memory pressure
(``_pressure.MemoryWatcher``) the pool's limit drops and the coldest chunks leave RAM
down to it. A chunk already on disk just leaves RAM; one not written yet is pinned by
its pending write and stays; one with no copy on disk is evicted (a later recompute,
never a wrong answer). Pinned chunks never leave (``Ledger.demotion_order``).

The store (``_store.TieredStore``) owns one and shares its lock and ledger with it:
every method here runs under that lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._figures import RamFigures
from ._ledger import Ledger, Record
from ._pool import RamPool


class RamRoom:
    def __init__(
        self,
        pool: RamPool,
        ledger: Ledger,
        lock: threading.RLock,
        high_watermark: float,
        low_watermark: float,
        min_residency_s: float,
    ) -> None:
        self.pool, self._ledger, self._lock = pool, ledger, lock
        self.high, self.low = high_watermark, low_watermark
        self.min_residency_s = min_residency_s
        self.demotions = 0  # chunks that left RAM
        self.evictions = 0  # ... with no copy on disk: gone
        self.pressure_events = 0  # times the limit was lowered for the system's sake
        self.returned_bytes = 0  # pages handed back to the OS, in all

    def alloc(self, nbytes: int) -> int | None:
        """A free slot for ``nbytes`` (demoting down to the low watermark first when the
        pool is at the high one); None when none can be had, or a chunk that big fits
        no slot (one cut with other settings may be larger)."""
        if nbytes > self.pool.slot_bytes:
            return None
        with self._lock:
            if self.pool.fill() >= self.high or not self.pool.has_free:
                self._demote(lambda: self.pool.fill() <= self.low and self.pool.has_free)
            return self.pool.alloc()

    def release(self, slot: int | None) -> None:
        if slot is not None:
            with self._lock:
                self.pool.release(slot)

    def may_fill(self, make_room: bool) -> bool:
        """Whether a chunk may be read into the pool now: not at the high watermark
        (unless ``make_room``), and not while memory is short (the limit at 0: a read
        would land nowhere)."""
        with self._lock:
            if not make_room and self.pool.fill() >= self.high:
                return False
            return bool(self.pool.limit_slots)

    def _demote(self, enough: Callable[[], bool]) -> None:
        """Takes chunks out of RAM, coldest first, until ``enough()`` (lock held)."""
        for record in self._ledger.demotion_order(self.min_residency_s):
            if enough():
                break
            self._demote_one(record)

    def _demote_one(self, record: Record) -> None:
        """Takes an unpinned chunk out of RAM (lock held): kept if it is on disk."""
        if record.slot is None:
            return
        self.pool.release(record.slot)
        record.slot = None
        self.demotions += 1
        if not record.on_disk:
            self._ledger.remove(record.key)
            self.evictions += 1

    def stats(self) -> RamFigures:
        """The chunks in the pool, and its slots and memory."""
        pool = self.pool
        with self._lock:
            ram = [r for r in self._ledger.records.values() if r.slot is not None]
            return RamFigures(
                *(len(ram), sum(len(r.tokens) for r in ram), sum(r.nbytes for r in ram)),
                *(pool.capacity_bytes, pool.limit_bytes, pool.resident_bytes),
                *(pool.returnable, pool.n_slots, pool.memory_kind),
            )

    # memory pressure (the MemoryWatcher's target) ----------------------------------
    def figures(self) -> tuple[int, int, int]:
        """(resident bytes, limit bytes, capacity bytes) of the pool."""
        with self._lock:
            return self.pool.resident_bytes, self.pool.limit_bytes, self.pool.capacity_bytes

    def shrink(self, limit_bytes: int) -> int:
        """Lowers the pool's limit to ``limit_bytes``: the coldest chunks leave RAM down
        to it, and the pages of every free slot go back to the OS. Returns the bytes
        given back. Chunks still pinned (being read, or waiting for their disk write)
        stay for the next call."""
        with self._lock:
            self.pool.set_limit(limit_bytes)
            self._demote(lambda: self.pool.used_slots <= self.pool.limit_slots)
            freed = self.pool.give_back()
            self.pressure_events += 1
            self.returned_bytes += freed
            return freed

    def grow(self, limit_bytes: int) -> None:
        """Raises the pool's limit (at most to its capacity) once memory is back."""
        with self._lock:
            self.pool.set_limit(max(limit_bytes, self.pool.limit_bytes))
