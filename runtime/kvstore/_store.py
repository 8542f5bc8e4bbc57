"""The tiered store: the RAM pool over the disk tier, with write-through in the background.

It plans and keeps records; it never moves bytes (vLLM's KV offloading manager is
the model). A load is ``prepare_load`` (the stored prefix of a prompt, pinned, and
where each chunk's bytes are), the bytes moved by the transfer worker
(``_transfer.Transfers``) or read by the engine from the pool, then
``complete_load``. A store is ``prepare_store`` (the chunks it lacks, with room
reserved), the engine cutting their bytes into that room, then ``complete_store``,
which records them and has the worker write them through. Expected refusals (a
miss, no room, a write that failed) are return values and reports, not exceptions.

Knows nothing of llama.cpp. All public methods may be called from the runtime's
worker thread while the transfer worker writes to disk.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..errors import CacheError, DiskFull, DiskUnavailable
from ._batches import chunk_spans
from ._disk import DiskTier, DiskUsage
from ._figures import DiskFigures, RamFigures, StoreStats
from ._index import unshared
from ._keys import chunk_key, root_key, scoped_root
from ._ledger import Ledger, Record
from ._plans import Load, LoadPlan, Read, Save, StorePlan
from ._pool import RamPool
from ._transfer import Transfers

log = logging.getLogger(__name__)


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
        run_tokens: int = 1,
        durable_s: float = math.inf,
    ) -> None:
        """``reopen`` opens the disk tier again (raising DiskUnavailable): with it, a
        tier that could not be opened (``disk`` None, ``disk_problem`` saying why) or
        stopped being writable is tried again every ``retry_s`` seconds. ``run_tokens``:
        the longest chunk a run of one-token batches is kept in (see ``chunk_spans``;
        1: a chunk for each). ``durable_s``: a write waits for a quiet engine until
        half of it has passed since the chunk was kept, no longer (Transfers)."""
        self.durable_s = durable_s
        self.run_tokens = run_tokens
        self.fingerprint = fingerprint
        self.root = root_key(fingerprint)
        self._roots: dict[str, bytes] = {"": self.root}
        self.pool = pool
        self.disk = disk
        self.high, self.low = high_watermark, low_watermark
        self.min_residency_s = min_residency_s
        self.ledger = Ledger(clock)
        self._lock = threading.RLock()
        self.transfers = Transfers(self)
        self.counters = {
            "evictions": 0,
            "demotions": 0,
            "corrupt": 0,
            "disk_full": 0,
            "written": 0,
            "dropped": 0,
            "culled": 0,  # chunks the disk tier's budget evicted (its LRU)
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
        self.transfers.start()

    def _adopt(self, disk: DiskTier) -> None:
        """Indexes what ``disk`` holds (no blob is read)."""
        for row in disk.rows():
            with self._lock:
                existing = self.ledger.get(row.key)
                if existing is not None:
                    existing.on_disk = True
                    continue
                fields = (row.key, row.parent, row.start, row.tokens, row.nbytes)
                self.ledger.add(Record(*fields, on_disk=True, last_used=0.0))

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
        self.transfers.wake()

    def maybe_recover(self) -> None:
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
                    record.pins += 1  # the write holds it until flushed, as in _commit()
                    self.transfers.write(record, self.pool.view(record.slot, record.nbytes))
        log.warning("disk tier back: writing to the disk cache again (%d chunks)", len(pending))

    def root_for(self, scope: str) -> bytes:
        """The first parent of the chains of a cache scope (see ``scoped_root``)."""
        root = self._roots.get(scope)
        if root is None:
            root = self._roots[scope] = scoped_root(self.fingerprint, scope)
        return root

    # loads ----------------------------------------------------------------------
    def prepare_load(
        self, ids: Sequence[int], cuts: Sequence[int], staging_bytes: int = 0, scope: str = ""
    ) -> LoadPlan:
        """The stored chunks of ``ids``, one per batch of ``cuts`` (the batch ends its
        prefill uses), kept under the cache ``scope``, pinned until ``complete_load``;
        disk chunks are given places in a staging memory of ``staging_bytes``, one after
        another while it lasts."""
        with self._lock:
            records = self._stored(ids, cuts, scope)
            self.ledger.pin(records)
            loads, at = [], 0
            for r in records:
                offset = None
                if r.tier == "disk" and staging_bytes - at >= r.nbytes:
                    offset, at = at, at + r.nbytes
                tier = r.tier or "disk"
                loads.append(Load(r.key, r.start, r.end, r.nbytes, tier, r.slot, offset))
            return LoadPlan(tuple(loads), tuple(records))

    def held(self, ids: Sequence[int], cuts: Sequence[int], scope: str = "") -> int:
        """How many leading tokens of ``ids`` (computed in batches ending at ``cuts``)
        the store holds in some tier under ``scope``, as whole chunks; nothing is pinned."""
        with self._lock:
            records = self._stored(ids, cuts, scope)
            return records[-1].end if records else 0

    def _stored(self, ids: Sequence[int], cuts: Sequence[int], scope: str) -> list[Record]:
        """The chunks of ``ids`` held in some tier, from its start (lock held)."""
        records = []
        spans = chunk_spans(cuts, 0, self.run_tokens)
        for hit in self.ledger.lookup(self.root_for(scope), ids, spans):
            if hit.record.tier is None:
                break
            records.append(hit.record)
        return records

    def complete_load(self, plan: LoadPlan) -> None:
        """Unpins; a chunk doomed while it was being read goes now."""
        with self._lock:
            self.ledger.unpin(plan.records)
            self.ledger.touch(plan.records)
            for record in plan.records:
                if record.doomed:
                    self._forget(record)

    def begin_read(self, record: Record, staging: np.ndarray | None = None) -> Read | None:
        """For the transfer worker: where one chunk's bytes are, and where a disk read
        of them lands (``staging`` when it fits, else a free pool slot, else a buffer
        of its own); None when the chunk is in no tier."""
        with self._lock:
            if record.slot is not None and self.pool is not None:
                return Read(ready=self.pool.view(record.slot, record.nbytes))
            if record.held is not None:
                return Read(ready=record.held)
            if self.disk is None or not record.on_disk:
                return None
            if staging is not None and staging.nbytes >= record.nbytes:
                return Read(buffer=staging)
            # (a chunk cut with other settings may be larger than a slot)
            fits = self.pool is not None and record.nbytes <= self.pool.slot_bytes
            slot = self._alloc_slot() if fits else None
        if slot is not None and self.pool is not None:
            return Read(buffer=self.pool.view(slot), slot=slot)
        return Read(buffer=np.empty(record.nbytes, dtype=np.uint8))

    def end_read(
        self, record: Record, read: Read, n: int | None, corrupt: bool
    ) -> np.ndarray | None:
        """The transfer worker's report of a disk read (``n`` bytes, None when the blob
        was gone): the bytes as landed, or None (the chunk then dropped)."""
        with self._lock:
            self.counters["corrupt"] += int(corrupt)
            if n is None or n != record.nbytes or read.buffer is None:
                self._release_slot(read.slot)
                self._forget(record)
                return None
            if read.slot is None:
                return read.buffer[:n]
            assert self.pool is not None
            if record.slot is not None:  # promoted meanwhile by another reader
                self.pool.release(read.slot)
                return self.pool.view(record.slot, n)
            self.pool.set_length(read.slot, n)
            record.slot = read.slot
            record.promoted_at = self.ledger.clock()
            return self.pool.view(read.slot, n)

    def _release_slot(self, slot: int | None) -> None:
        if slot is not None and self.pool is not None:
            self.pool.release(slot)

    def chain(self, leaf: bytes) -> list[Record]:
        with self._lock:
            return self.ledger.chain(leaf)

    def parent_of(self, key: bytes) -> bytes | None:
        """The key before ``key`` in its chain (None: not stored)."""
        with self._lock:
            record = self.ledger.get(key)
            return None if record is None else record.parent

    # stores ---------------------------------------------------------------------
    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            record = self.ledger.get(key)
            return record is not None and record.tier is not None and not record.doomed

    def prepare_store(
        self,
        tokens: Sequence[int],
        ends: Sequence[int],
        size: Callable[[int], int],
        parent: bytes | None = None,
        start: int = 0,
        scope: str = "",
    ) -> StorePlan:
        """The chunks of a sequence along its batch ``ends`` (positions), with room
        reserved (``size(n)`` bytes for ``n`` tokens) for each one the store lacks.
        ``tokens`` start at position ``start`` of a prefix named ``parent`` (default:
        the whole sequence from position 0, kept under the cache ``scope``)."""
        keys, saves = [], []
        parent = self.root_for(scope) if parent is None else parent
        spans = chunk_spans(ends, start, self.run_tokens)
        with self._lock:
            for c0, c1, stepped in spans:
                segment = tuple(tokens[c0 - start : c1 - start])
                key = chunk_key(parent, segment, stepped)
                if key not in self:
                    buffer, slot = self._reserve(size(len(segment)))
                    saves.append(Save(key, parent, c0, segment, buffer, slot))
                keys.append(key)
                parent = key
        return StorePlan([c1 for _, c1, _ in spans], keys, saves)

    def _reserve(self, nbytes: int) -> tuple[np.ndarray, int | None]:
        """Room for ``nbytes``: a pool slot when one can be had, else a buffer."""
        if self.pool is not None and nbytes <= self.pool.slot_bytes:
            slot = self._alloc_slot()
            if slot is not None:
                return self.pool.view(slot), slot
        return np.empty(nbytes, dtype=np.uint8), None

    def complete_store(self, plan: StorePlan, ok: bool = True) -> bytes | None:
        """Records the chunks written (``nbytes`` set), up to the first one that was
        not, and writes them through; the rest give their room back. ``ok`` False:
        nothing is recorded. Returns the key of the longest prefix now kept."""
        with self._lock:
            failed = not ok
            for save in plan.saves:
                failed = failed or save.nbytes is None
                if failed:
                    self._release_slot(save.slot)
                else:
                    self._commit(save)
        return plan.leaf() if ok else None

    def _commit(self, save: Save) -> Record:
        """Records one chunk (lock held) and has it written through."""
        assert save.nbytes is not None
        nbytes = save.nbytes
        existing = self.ledger.get(save.key)
        if existing is not None and existing.tier is not None:
            existing.doomed = False  # wanted again after all
            self._release_slot(save.slot)
            return existing
        if existing is not None:
            self.ledger.remove(save.key)
        record = Record(save.key, save.parent, save.start, save.tokens, nbytes)
        if save.slot is not None and self.pool is not None:
            self.pool.set_length(save.slot, nbytes)
            record.slot = save.slot
            record.promoted_at = self.ledger.clock()
        self.ledger.add(record)
        if self.disk is not None and not self.disk_degraded:
            record.pins += 1  # the write holds it until flushed
            if record.slot is not None and self.pool is not None:
                payload = self.pool.view(record.slot, nbytes)
            else:  # readable until written: a later prompt may share it meanwhile
                payload = record.held = save.buffer[:nbytes]
            self.transfers.write(record, payload)
        elif record.slot is None:
            self.ledger.remove(save.key)  # no RAM, no disk: nothing holds it
        return record

    def written(self, record: Record, problem: CacheError | None) -> None:
        """The transfer worker's report of a write-through (``problem`` None: on disk)."""
        if isinstance(problem, DiskUnavailable):
            if isinstance(problem, DiskFull):
                self.counters["disk_full"] += 1
            self._degrade(str(problem))
        ok = problem is None
        culled = self.disk.take_culled() if self.disk is not None else set()
        with self._lock:
            record.pins = max(0, record.pins - 1)
            record.on_disk = record.on_disk or ok
            record.held = None  # on disk now, or lost
            self.counters["written"] += int(ok)
            if record.slot is None and not record.on_disk:
                self.ledger.remove(record.key)
            elif record.doomed and not record.pins:
                self._forget(record)
            self._forget_culled(culled)

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
            self.transfers.delete(record.key)

    def drop_unshared(self, leaf: bytes, others: Iterable[bytes | None]) -> int:
        """Forgets the chunks of the conversation ending at ``leaf`` that none of
        ``others`` (the other conversations' leaves) uses; returns how many."""
        return self.drop(list(unshared(self.parent_of, leaf, others)))

    def drop(self, keys: Sequence[bytes]) -> int:
        """Forgets these chunks in every tier (unpinned ones); returns how many."""
        n = 0
        for key in keys:
            record = self.ledger.get(key)
            if record is not None:
                self._forget(record)
                n += 1
        return n

    def may_promote(self, record: Record, make_room: bool) -> bool | None:
        """Whether ``record`` is worth reading into the pool now; None when nothing is
        (no pool, at the watermark without ``make_room``, memory short)."""
        with self._lock:
            if record.slot is not None or not record.on_disk or record.key not in self.ledger:
                return False
            if self.pool is None or (not make_room and self.pool.fill() >= self.high):
                return None
            if not self.pool.limit_slots:  # memory is short: a read would land nowhere
                return None
            return True

    def _forget_culled(self, culled: set[bytes]) -> None:
        """Chunks whose blob diskcache culled are no longer on disk (lock held); one
        being read finds its blob gone and is dropped then (see read)."""
        self.counters["culled"] += len(culled)
        for key in culled:
            record = self.ledger.get(key)
            if record is not None and record.on_disk and not record.pins:
                record.on_disk = False
                if record.slot is None:
                    self.ledger.remove(record.key)

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every chunk captured so far is on disk and every deletion asked
        for so far is done; False when ``timeout`` ran out first."""
        return self.transfers.flush(timeout)

    def stats(self) -> StoreStats:
        """Counts from what is really there: the disk figures are the disk tier's own
        counts, kept as it writes, culls and deletes (no listing, no walk here)."""
        disk = self.disk.usage if self.disk is not None else DiskUsage()
        pool = self.pool
        with self._lock:
            records = list(self.ledger.records.values())
            ram = [r for r in records if r.slot is not None]
            pool_figures = RamFigures(
                *(len(ram), sum(len(r.tokens) for r in ram), sum(r.nbytes for r in ram)),
                capacity_bytes=pool.capacity_bytes if pool else 0,
                limit_bytes=pool.limit_bytes if pool else 0,
                resident_bytes=pool.resident_bytes if pool else 0,
                returnable=pool.returnable if pool else False,
                slots=pool.n_slots if pool else 0,
                memory=pool.memory_kind if pool else "none",
            )
            disk_figures = DiskFigures(
                *(disk.chunks, disk.tokens, disk.kv_bytes, disk.used_bytes),
                degraded=self.disk_degraded,
                degraded_reason=self.degraded_reason,
            )
            pending = self.transfers.pending()
            return StoreStats(len(records), pool_figures, disk_figures, pending, **self.counters)

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
        self.transfers.close()
        if self.disk is not None:
            self.disk.close()
