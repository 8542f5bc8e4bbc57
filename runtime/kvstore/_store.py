"""The tiered store: RAM pool (T1) over disk (T2), with write-through in the background.

Knows nothing of llama.cpp: it takes and gives KV bytes. The runtime core copies
them out of and into the context. All public methods may be called from the
runtime's worker thread while the writer thread flushes to disk.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CacheError, DiskFull, DiskUnavailable
from ._disk import DiskTier, DiskUsage, IndexRow
from ._keys import root_key
from ._ledger import Hit, Ledger, Record
from ._pool import RamPool

log = logging.getLogger(__name__)


@dataclass
class Reservation:
    """Room for one chunk being captured: a pool slot, or a temporary buffer."""

    buffer: np.ndarray
    slot: int | None


class TieredStore:
    def __init__(
        self,
        fingerprint: str,
        pool: RamPool | None,
        disk: DiskTier | None,
        high_watermark: float = 0.9,
        low_watermark: float = 0.7,
        min_residency_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        reopen: Callable[[], DiskTier] | None = None,
        disk_problem: str | None = None,
        retry_s: float = 30.0,
    ) -> None:
        """``reopen`` opens the disk tier again (raising DiskUnavailable): with it, a
        tier that could not be opened (``disk`` None, ``disk_problem`` saying why) or
        stopped being writable is tried again every ``retry_s`` seconds."""
        self.root = root_key(fingerprint)
        self.pool = pool
        self.disk = disk
        self.high, self.low = high_watermark, low_watermark
        self.min_residency_s = min_residency_s
        self.ledger = Ledger(clock)
        self._lock = threading.RLock()
        self._writes: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self.counters = {
            "evictions": 0,
            "demotions": 0,
            "corrupt": 0,
            "disk_full": 0,
            "written": 0,
            "dropped": 0,
            "disk_unavailable": 0,
            "pressure_events": 0,  # times the pool was shrunk for the system's sake
            "returned_bytes": 0,  # pool pages handed back to the OS, in all
        }
        self.disk_degraded = False
        self.degraded_reason: str | None = None
        self._reopen, self.retry_s = reopen, retry_s
        self._last_try = time.monotonic()
        if disk is not None:
            self._adopt(disk)
        elif disk_problem is not None:
            self._degrade(disk_problem)
        self._writer = threading.Thread(target=self._write_loop, name="kv-writer", daemon=True)
        self._writer.start()

    def _adopt(self, disk: DiskTier) -> None:
        """Indexes what ``disk`` holds (no blob is read)."""
        for row in disk.rows():
            with self._lock:
                existing = self.ledger.get(row.key)
                if existing is not None:
                    existing.on_disk = True
                    continue
                self.ledger.add(
                    Record(
                        row.key,
                        row.parent,
                        row.start,
                        row.tokens,
                        row.nbytes,
                        on_disk=True,
                        last_used=0.0,
                    )
                )

    # a degraded disk tier ------------------------------------------------------
    def _degrade(self, reason: str) -> None:
        """Stops writing to disk; said once per episode (log, stats, /health, metric)."""
        self.counters["disk_unavailable"] += 1
        self._last_try = time.monotonic()
        if not self.disk_degraded:
            hint = "; `warmstart cache clear` resets a damaged cache" if self.disk is None else ""
            log.warning(
                "disk tier off: %s. Serving from RAM only; trying the disk again every %.0f s%s",
                reason,
                self.retry_s,
                hint,
            )
        self.disk_degraded, self.degraded_reason = True, reason

    def retry_now(self) -> None:
        """Tries the degraded disk tier again at the writer's next turn."""
        self._last_try = float("-inf")
        self._writes.put(("noop", None))

    def _maybe_recover(self) -> None:
        """On the writer thread: brings the disk tier back once it can write again,
        and writes through the chunks captured meanwhile (those still in RAM)."""
        if not self.disk_degraded or time.monotonic() - self._last_try < self.retry_s:
            return
        self._last_try = time.monotonic()
        if self.disk is None:
            if self._reopen is None:
                return
            try:
                disk = self._reopen()
            except DiskUnavailable as exc:
                self.degraded_reason = str(exc)
                return
            self._adopt(disk)
            self.disk = disk
        elif not self.disk.writable():
            return
        with self._lock:
            self.disk_degraded, self.degraded_reason = False, None
            pending = [r for r in self.ledger.records.values() if not r.on_disk]
            for record in pending:
                if record.slot is not None and self.pool is not None:
                    record.pins += 1  # the write holds it until flushed, as in commit()
                    payload = self.pool.view(record.slot, record.nbytes)
                    self._writes.put(("put", (record, payload)))
        log.warning("disk tier back: writing to the disk cache again (%d chunks)", len(pending))

    # lookup and reads ---------------------------------------------------------
    def lookup(self, ids: Sequence[int], cuts: Sequence[int]) -> list[Hit]:
        """prepare_load: the cached chunks of ``ids`` along ``cuts``, pinned."""
        with self._lock:
            hits = self.ledger.lookup(self.root, ids, cuts)
            out = []
            for hit in hits:
                if hit.record.tier is None:
                    break
                out.append(hit)
            self.ledger.pin(h.record for h in out)  # prepare_load: pinned until release()
            return out

    def release(self, hits: Sequence[Hit]) -> None:
        """complete_load: unpins; a chunk doomed while it was being read goes now."""
        with self._lock:
            self.ledger.unpin(h.record for h in hits)
            self.ledger.touch(h.record for h in hits)
            for hit in hits:
                if hit.record.doomed:
                    self._forget(hit.record)

    def read(self, record: Record, staging: np.ndarray | None = None) -> np.ndarray | None:
        """The chunk's bytes from the fastest tier. A disk read lands in ``staging`` when
        given (memory already touched: the request path pays no page faults; promote()
        later), else straight in a free pool slot (so reading it promotes it, with no
        extra copy). None when the chunk is gone or proved corrupt (then dropped)."""
        with self._lock:
            if record.slot is not None and self.pool is not None:
                return self.pool.view(record.slot, record.nbytes)
            if self.disk is None or not record.on_disk:
                return None
            use_staging = staging is not None and staging.nbytes >= record.nbytes
            slot = self._alloc_slot() if self.pool is not None and not use_staging else None
        assert self.disk is not None
        buf: np.ndarray
        if use_staging and staging is not None:
            buf = staging
        elif slot is not None and self.pool is not None:
            buf = self.pool.view(slot)
        else:
            buf = np.empty(record.nbytes, dtype=np.uint8)
        try:
            n = self.disk.read_into(record.key, buf)
        except CacheError as exc:
            log.warning("dropping chunk %s: %s", record.key.hex()[:12], exc)
            self.counters["corrupt"] += 1
            n = None
        return self._land(record, slot, buf, n)

    def _land(
        self, record: Record, slot: int | None, buf: np.ndarray, n: int | None
    ) -> np.ndarray | None:
        with self._lock:
            if n is None or n != record.nbytes:
                self._release_slot(slot)
                self._forget(record)
                return None
            if slot is None:
                return buf[:n]
            assert self.pool is not None
            if record.slot is not None:  # promoted meanwhile by another reader
                self.pool.release(slot)
                return self.pool.view(record.slot, n)
            self.pool.set_length(slot, n)
            record.slot = slot
            record.promoted_at = self.ledger.clock()
            return self.pool.view(slot, n)

    def _release_slot(self, slot: int | None) -> None:
        if slot is not None and self.pool is not None:
            self.pool.release(slot)

    def chain(self, leaf: bytes) -> list[Record]:
        with self._lock:
            return self.ledger.chain(leaf)

    # capture ------------------------------------------------------------------
    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            record = self.ledger.get(key)
            return record is not None and record.tier is not None and not record.doomed

    def reserve(self, nbytes: int) -> Reservation:
        """prepare_store: room for ``nbytes`` (a pool slot when one can be had)."""
        with self._lock:
            if self.pool is not None and nbytes <= self.pool.slot_bytes:
                slot = self._alloc_slot()
                if slot is not None:
                    return Reservation(self.pool.view(slot), slot)
        return Reservation(np.empty(nbytes, dtype=np.uint8), None)

    def abort(self, reservation: Reservation) -> None:
        """complete_store(success=False)."""
        if reservation.slot is not None and self.pool is not None:
            with self._lock:
                self.pool.release(reservation.slot)

    def commit(
        self,
        reservation: Reservation,
        key: bytes,
        parent: bytes,
        start: int,
        tokens: Sequence[int],
        nbytes: int,
    ) -> Record:
        """complete_store(success=True): records the chunk and writes it through."""
        with self._lock:
            record = Record(key, parent, start, tuple(tokens), nbytes)
            existing = self.ledger.get(key)
            if existing is not None and existing.tier is not None:
                existing.doomed = False  # wanted again after all
                self.abort(reservation)
                return existing
            if existing is not None:
                self.ledger.remove(key)
            if reservation.slot is not None and self.pool is not None:
                self.pool.set_length(reservation.slot, nbytes)
                record.slot = reservation.slot
                record.promoted_at = self.ledger.clock()
            self.ledger.add(record)
            if self.disk is not None and not self.disk_degraded:
                record.pins += 1  # the write holds it until flushed
                payload = (
                    self.pool.view(record.slot, nbytes)
                    if record.slot is not None and self.pool is not None
                    else reservation.buffer[:nbytes]
                )
                self._writes.put(("put", (record, payload)))
            elif record.slot is None:
                self.ledger.remove(key)  # no RAM, no disk: nothing holds it
            return record

    # room and forgetting -----------------------------------------------------
    def _alloc_slot(self) -> int | None:
        assert self.pool is not None
        if self.pool.fill() >= self.high or not self.pool.has_free:
            self._demote(target=self.low)
        return self.pool.alloc()

    def _demote(self, target: float) -> None:
        """Frees pool slots, coldest first, down to ``target`` fill. A chunk already on
        disk just leaves RAM; one that is not on disk yet is pinned by its pending
        write and stays; with no disk tier, leaving RAM means eviction."""
        assert self.pool is not None
        for record in self.ledger.demotion_order(self.min_residency_s):
            if self.pool.fill() <= target and self.pool.has_free:
                break
            self._demote_one(record)

    def _demote_one(self, record: Record) -> None:
        """Takes an unpinned chunk out of RAM (lock held): kept if it is on disk."""
        assert self.pool is not None
        if record.slot is None:
            return
        self.pool.release(record.slot)
        record.slot = None
        self.counters["demotions"] += 1
        if not record.on_disk:
            self.ledger.remove(record.key)
            self.counters["evictions"] += 1

    # memory pressure ---------------------------------------------------------
    def shrink_ram(self, limit_bytes: int) -> int:
        """Lowers the pool's limit to ``limit_bytes``: the coldest chunks leave RAM down
        to it (to disk, where those already written just stay; with the disk tier off
        they are dropped: a later recompute, never a wrong answer), and the pages of
        every free slot go back to the OS. Returns the bytes given back. Chunks still
        pinned (being read, or waiting for their disk write) stay for the next call."""
        if self.pool is None:
            return 0
        with self._lock:
            self.pool.set_limit(limit_bytes)
            for record in self.ledger.demotion_order(self.min_residency_s):
                if self.pool.used_slots <= self.pool.limit_slots:
                    break
                self._demote_one(record)
            freed = self.pool.give_back()
            self.counters["pressure_events"] += 1
            self.counters["returned_bytes"] += freed
            return freed

    def grow_ram(self, limit_bytes: int) -> None:
        """Raises the pool's limit (at most to its capacity) once memory is back."""
        if self.pool is not None:
            with self._lock:
                self.pool.set_limit(max(limit_bytes, self.pool.limit_bytes))

    def ram_figures(self) -> tuple[int, int, int]:
        """(resident bytes, limit bytes, capacity bytes) of the pool, for the watcher."""
        if self.pool is None:
            return 0, 0, 0
        with self._lock:
            return self.pool.resident_bytes, self.pool.limit_bytes, self.pool.capacity_bytes

    def _forget(self, record: Record) -> None:
        """Drops a chunk from every tier; a pinned one (being read or written) is doomed
        instead and goes when its last pin does."""
        with self._lock:
            if record.pins:
                record.doomed = True
                return
            if record.slot is not None and self.pool is not None:
                self.pool.release(record.slot)
                record.slot = None
            self.ledger.remove(record.key)
            self.counters["dropped"] += 1
        if record.on_disk and self.disk is not None:
            self._writes.put(("delete", record.key))

    def drop(self, keys: Sequence[bytes]) -> int:
        """Forgets these chunks in every tier (unpinned ones); returns how many."""
        n = 0
        for key in keys:
            record = self.ledger.get(key)
            if record is not None:
                self._forget(record)
                n += 1
        return n

    def promote(
        self,
        records: Sequence[Record],
        make_room: bool = True,
        stop: threading.Event | None = None,
    ) -> int:
        """Brings disk-only chunks into the pool (off the request path); returns tokens
        promoted. Without ``make_room`` (prewarm) it stops at the high watermark rather
        than demote chunks that are warm for a reason; ``stop`` set ends it early."""
        tokens = 0
        for record in records:
            if stop is not None and stop.is_set():
                break
            if record.slot is not None or not record.on_disk or record.key not in self.ledger:
                continue
            if self.pool is None or (not make_room and self.pool.fill() >= self.high):
                break
            if not self.pool.limit_slots:  # memory is short: a read would land nowhere
                break
            if self.read(record) is not None and record.slot is not None:
                tokens += len(record.tokens)
        return tokens

    # the writer ----------------------------------------------------------------
    def _write_loop(self) -> None:
        while True:
            try:
                item = self._writes.get(timeout=self.retry_s)
            except queue.Empty:
                self._maybe_recover()
                continue
            self._maybe_recover()
            try:
                if item is None:
                    return
                op, arg = item
                if op == "put":
                    self._write_one(*arg)
                elif op == "delete" and self.disk is not None:
                    self.disk.delete(arg)
            except Exception:  # the writer must outlive any one bad chunk
                log.exception("background cache write failed")
            finally:
                self._writes.task_done()

    def _write_one(self, record: Record, payload: np.ndarray) -> None:
        assert self.disk is not None
        culled: set[bytes] = set()
        try:
            culled = self.disk.put(
                IndexRow(record.key, record.parent, record.start, record.tokens, record.nbytes),
                payload.data,
            )
            ok = True
        except DiskUnavailable as exc:
            ok = False
            if isinstance(exc, DiskFull):
                self.counters["disk_full"] += 1
            self._degrade(str(exc))
        except CacheError as exc:
            ok = False
            log.warning("%s", exc)
        with self._lock:
            record.pins = max(0, record.pins - 1)
            record.on_disk = record.on_disk or ok
            self.counters["written"] += int(ok)
            if record.slot is None and not record.on_disk:
                self.ledger.remove(record.key)
            elif record.doomed and not record.pins:
                self._forget(record)
            self._forget_culled(culled)

    def _forget_culled(self, culled: set[bytes]) -> None:
        """Chunks whose blob diskcache culled are no longer on disk (lock held); one
        being read finds its blob gone and is dropped then (see read)."""
        for key in culled:
            record = self.ledger.get(key)
            if record is not None and record.on_disk and not record.pins:
                record.on_disk = False
                if record.slot is None:
                    self.ledger.remove(record.key)

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every chunk captured so far is on disk and every deletion asked
        for so far is done; False when ``timeout`` ran out first."""
        done = self._writes.all_tasks_done
        with done:
            return done.wait_for(lambda: not self._writes.unfinished_tasks, timeout)

    def stats(self) -> dict[str, Any]:
        """Counts from what is really there: the disk figures are the disk tier's own
        counts, kept as it writes, culls and deletes (no listing, no walk here)."""
        disk = self.disk.usage if self.disk is not None else DiskUsage()
        pool = self.pool
        with self._lock:
            records = list(self.ledger.records.values())
            ram = [r for r in records if r.slot is not None]
            out: dict[str, Any] = {
                "chunks": len(records),
                "ram": {
                    "chunks": len(ram),
                    "tokens": sum(len(r.tokens) for r in ram),
                    "used_bytes": sum(r.nbytes for r in ram),
                    "capacity_bytes": pool.capacity_bytes if pool else 0,
                    "limit_bytes": pool.limit_bytes if pool else 0,
                    "resident_bytes": pool.resident_bytes if pool else 0,
                    "returnable": pool.returnable if pool else False,
                    "slots": pool.n_slots if pool else 0,
                    "memory": pool.memory_kind if pool else "none",
                },
                "disk": {
                    "chunks": disk.chunks,
                    "tokens": disk.tokens,
                    "kv_bytes": disk.kv_bytes,
                    "used_bytes": disk.used_bytes,
                    "degraded": self.disk_degraded,
                    "degraded_reason": self.degraded_reason,
                },
                "pending_writes": self._writes.qsize(),
            }
            out.update(self.counters)
            return out

    def clear(self) -> None:
        self.flush()
        with self._lock:
            for record in list(self.ledger.records.values()):
                if record.slot is not None and self.pool is not None:
                    self.pool.release(record.slot)
                record.pins = 0
                self.ledger.remove(record.key)
            if self.disk is not None:
                self.disk.clear()

    def close(self) -> None:
        if self._writer.is_alive():
            self._writes.put(None)
            self._writer.join()
        if self.disk is not None:
            self.disk.close()
