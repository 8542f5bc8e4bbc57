"""The tiered store: the RAM pool over the disk tier, with write-through in the background.

It plans and keeps records (vLLM's KV offloading manager is the model) and owns the
transfers that move bytes between the tiers (``_transfer.Transfers``), which it calls
and which never call it back: a move's result is their return value. A load is
``prepare_load`` (the stored prefix of a prompt, pinned, and where each chunk's bytes
are), ``load`` (RAM chunks as pool views, disk chunks read where the plan put them),
then ``complete_load``. A store is ``prepare_store`` (the chunks it lacks, with room
reserved), the engine cutting their bytes into that room, then ``complete_store``,
which records them and queues their write-through; the store's writer thread
(``kv-writer``) runs the queue and records each result. Expected refusals (a miss, no
room, a write that failed) are return values, not exceptions.

Room in the pool (watermarks, memory pressure) is ``_room.RamRoom``'s; whether the
disk tier may be written, and when to try it again, is ``_health.DiskHealth``'s.

Knows nothing of llama.cpp. All public methods may be called from any thread while
the writer thread writes to disk.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..errors import CacheError, DiskUnavailable
from ._batches import chunk_spans
from ._disk import DiskTier, DiskUsage
from ._figures import RamFigures, StoreStats
from ._health import DiskHealth
from ._index import unshared
from ._keys import chunk_key, root_key, scoped_root
from ._ledger import Ledger, Record
from ._plans import Load, LoadPlan, Read, Save, StorePlan
from ._pool import RamPool
from ._room import RamRoom
from ._transfer import Delete, Transfers, Write

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
        self.run_tokens = run_tokens
        self.fingerprint = fingerprint
        self.root = root_key(fingerprint)
        self._roots: dict[str, bytes] = {"": self.root}
        self.pool, self.disk = pool, disk
        self.ledger = Ledger(clock)
        self._lock = threading.RLock()
        room = (self.ledger, self._lock, high_watermark, low_watermark, min_residency_s)
        self.ram = RamRoom(pool, *room) if pool is not None else None
        self.health = DiskHealth(retry_s, reopen)
        self.transfers = Transfers(durable_s)
        self.corrupt = self.written = self.dropped = self.culled = 0
        if disk is not None:
            self._adopt(disk)
        elif disk_problem is not None:
            self.health.degrade(disk_problem, opened=False)
        self._writer = threading.Thread(target=self._write_through, name="kv-writer", daemon=True)
        self._writer.start()

    def _adopt(self, disk: DiskTier) -> None:
        """Indexes what ``disk`` holds (no blob is read)."""
        rows = list(disk.rows())  # SQLite reads, before the lock
        with self._lock:
            self.ledger.adopt(rows)

    # the writer thread ----------------------------------------------------------------
    def _write_through(self) -> None:
        """The ``kv-writer`` thread: the queued writes and deletions in order, each
        write's result recorded (``_written``); at every turn, and every ``retry_s``
        when idle, a degraded disk tier is tried again."""
        while True:
            job = self.transfers.next(timeout=self.health.retry_s)
            try:
                self._try_disk_again()
                if isinstance(job, Write):
                    self._written(job.record, Transfers.write(job))
                elif isinstance(job, Delete):
                    Transfers.delete(job)
                elif job is not None and job.stop:
                    return
            except Exception:  # the writer must outlive any one bad chunk
                log.exception("background cache write failed")
            finally:
                if job is not None:
                    self.transfers.done()

    def _try_disk_again(self) -> None:
        """Takes a degraded disk tier back once it can write again, and writes through
        the chunks captured meanwhile (those still in RAM)."""
        disk = self.health.usable(self.disk)
        if disk is None:
            return
        if disk is not self.disk:
            self._adopt(disk)
            self.disk = disk
        with self._lock:
            pending = [r for r in self.ledger.records.values() if not r.on_disk]
            for record in pending:
                if record.slot is not None and self.pool is not None:
                    record.pins += 1  # the write holds it until flushed, as in _commit()
                    self.transfers.enqueue_write(
                        disk, record, self.pool.view(record.slot, record.nbytes)
                    )
            self.health.back(len(pending))

    def retry_now(self) -> None:
        """Tries the degraded disk tier again at the writer's next turn."""
        self.health.retry_now()
        self.transfers.wake()

    def hold(self, busy: bool) -> None:
        """A request is being prefilled or decoded (``busy``), or none is any more:
        writes and the background prewarm wait meanwhile (``Transfers.hold``)."""
        self.transfers.hold(busy)

    @property
    def quiet(self) -> bool:
        """No request is being computed: writes go at once."""
        return self.transfers.quiet

    def root_for(self, scope: str) -> bytes:
        """The first parent of the chains of a cache scope (see ``scoped_root``)."""
        root = self._roots.get(scope)
        if root is None:
            root = self._roots[scope] = scoped_root(self.fingerprint, scope)
        return root

    # loads ----------------------------------------------------------------------
    def prepare_load(
        self,
        ids: Sequence[int],
        cuts: Sequence[int],
        staging_bytes: int = 0,
        scope: str = "",
        logits: bool = False,
    ) -> LoadPlan:
        """The stored chunks of ``ids``, one per batch of ``cuts`` (the batch ends its
        prefill uses), kept under the cache ``scope``, pinned until ``complete_load``;
        disk chunks are given places in a staging memory of ``staging_bytes``, one after
        another while it lasts. ``logits``: the last batch's chunk only with the logits
        it gave (the prompt's first token is sampled from them: without, that batch is
        computed again)."""
        with self._lock:
            records = self._stored(ids, cuts, scope)
            if logits and records and records[-1].end == cuts[-1] and not records[-1].logits:
                records.pop()
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

    # reads: on the caller's thread ------------------------------------------------------
    def load(self, plan: LoadPlan, staging: np.ndarray | None = None) -> list[np.ndarray]:
        """The plan's chunks' KV bytes in order, stopping at the first one gone or
        corrupt: RAM chunks as pool views, disk chunks read where the plan put them."""
        return self.load_prompt(plan, staging)[0]

    def load_prompt(
        self, plan: LoadPlan, staging: np.ndarray | None = None
    ) -> tuple[list[np.ndarray], np.ndarray | None]:
        """``load``'s KV bytes, and the next-token logits the last chunk read keeps
        (None: none): those of the prompt that ends there."""
        blobs, payload, last = [], None, None
        for load, record in zip(plan.loads, plan.records, strict=True):
            room = None
            if load.offset is not None and staging is not None:
                room = staging[load.offset : load.offset + load.nbytes]
            payload = self._payload(record, room)
            if payload is None:
                break
            blobs.append(payload[: record.kv_bytes])
            last = record
        if last is None or payload is None:
            return blobs, None
        return blobs, last.logits_of(payload)

    def read(self, record: Record, staging: np.ndarray | None = None) -> np.ndarray | None:
        """One chunk's KV bytes from the fastest tier (None: gone, or proved corrupt and
        dropped). A disk read lands in ``staging`` when given, else in a free pool slot
        (reading it promotes it, with no extra copy), else in a buffer of its own."""
        return self.read_logits(record, staging)[0]

    def read_logits(
        self, record: Record, staging: np.ndarray | None = None
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``read``'s KV bytes, and a copy of the logits the chunk keeps (None: none)."""
        payload = self._payload(record, staging)
        if payload is None:
            return None, None
        return payload[: record.kv_bytes], record.logits_of(payload)

    def _payload(self, record: Record, staging: np.ndarray | None) -> np.ndarray | None:
        """``read``'s bytes, with the logits the chunk keeps after its KV (if any)."""
        read, disk = self._read_room(record, staging)
        if read is None or read.ready is not None:
            return None if read is None else read.ready
        n, corrupt = None, False
        if disk is not None and read.buffer is not None:
            n, corrupt = self.transfers.read(disk, record.key, read.buffer, record.logits)
        return self._landed(record, read, n, corrupt)

    def _read_room(
        self, record: Record, staging: np.ndarray | None
    ) -> tuple[Read | None, DiskTier | None]:
        """Where one chunk's bytes are, or where its disk read lands (``staging`` when
        it fits, else a free pool slot, else a buffer of its own), and the disk tier
        to read from; None when the chunk is in no tier."""
        with self._lock:
            disk = self.disk
            if record.slot is not None and self.pool is not None:
                return Read(ready=self.pool.view(record.slot, record.nbytes)), disk
            if record.held is not None:
                return Read(ready=record.held), disk
            if disk is None or not record.on_disk:
                return None, disk
            if staging is not None and staging.nbytes >= record.nbytes:
                return Read(buffer=staging), disk
            slot = self.ram.alloc(record.nbytes) if self.ram is not None else None
        if slot is not None and self.pool is not None:
            return Read(buffer=self.pool.view(slot), slot=slot), disk
        return Read(buffer=np.empty(record.nbytes, dtype=np.uint8)), disk

    def _landed(
        self, record: Record, read: Read, n: int | None, corrupt: bool
    ) -> np.ndarray | None:
        """A disk read's result (``n`` bytes, None when the blob was gone): the bytes
        as landed, or None (the chunk then dropped)."""
        with self._lock:
            self.corrupt += int(corrupt)
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

    def promote(
        self,
        records: Sequence[Record],
        make_room: bool = True,
        stop: threading.Event | None = None,
        background: bool = False,
    ) -> int:
        """Brings disk-only chunks into the pool (off the request path); returns the
        tokens promoted. Without ``make_room`` (prewarm) it stops at the high watermark
        rather than demote chunks that are warm for a reason; ``stop`` set ends it.
        ``background`` (the startup prewarm): before each chunk it waits until no
        request is being prefilled or decoded, so that its disk reads and zstd
        decompression never take a core from a request's steps."""
        tokens = 0
        for record in records:
            if background:
                self.transfers.wait_quiet(lambda: stop is not None and stop.is_set())
            if stop is not None and stop.is_set():
                break
            verdict = self._may_promote(record, make_room)
            if verdict is None:  # no room for any of them
                break
            if verdict and self.read(record) is not None and record.slot is not None:
                tokens += len(record.tokens)
        return tokens

    def _may_promote(self, record: Record, make_room: bool) -> bool | None:
        """Whether ``record`` is worth reading into the pool now; None when nothing is
        (no pool, at the watermark without ``make_room``, memory short)."""
        with self._lock:
            if record.slot is not None or not record.on_disk or record.key not in self.ledger:
                return False
            if self.ram is None or not self.ram.may_fill(make_room):
                return None
            return True

    def _release_slot(self, slot: int | None) -> None:
        if self.ram is not None:
            self.ram.release(slot)

    # chains ---------------------------------------------------------------------
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
        logits: tuple[int, np.ndarray] | None = None,
    ) -> StorePlan:
        """The chunks of a sequence along its batch ``ends`` (positions), with room
        reserved (``size(n)`` bytes for ``n`` tokens) for each one the store lacks.
        ``tokens`` start at position ``start`` of a prefix named ``parent`` (default:
        the whole sequence from position 0, kept under the cache ``scope``).
        ``logits``: (position, the next-token logits the batch ending there gave, over
        the KV before it as the sequence holds it): kept with the chunk ending there."""
        keys, saves = [], []
        parent = self.root_for(scope) if parent is None else parent
        spans = chunk_spans(ends, start, self.run_tokens)
        with self._lock:
            for c0, c1, stepped in spans:
                segment = tuple(tokens[c0 - start : c1 - start])
                key = chunk_key(parent, segment, stepped)
                if key not in self:
                    mine = logits[1] if logits is not None and logits[0] == c1 else None
                    extra = 0 if mine is None else 4 * mine.size
                    buffer, slot = self._reserve(size(len(segment)) + extra)
                    saves.append(Save(key, parent, c0, segment, buffer, slot, logits=mine))
                keys.append(key)
                parent = key
        return StorePlan([c1 for _, c1, _ in spans], keys, saves)

    def _reserve(self, nbytes: int) -> tuple[np.ndarray, int | None]:
        """Room for ``nbytes``: a pool slot when one can be had, else a buffer."""
        slot = self.ram.alloc(nbytes) if self.ram is not None else None
        if slot is not None and self.pool is not None:
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
                    save.add_logits()
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
        record = Record(save.key, save.parent, save.start, save.tokens, nbytes, save.logits_bytes)
        if save.slot is not None and self.pool is not None:
            self.pool.set_length(save.slot, nbytes)
            record.slot = save.slot
            record.promoted_at = self.ledger.clock()
        self.ledger.add(record)
        if self.disk is not None and not self.health.degraded:
            record.pins += 1  # the write holds it until flushed
            if record.slot is not None and self.pool is not None:
                payload = self.pool.view(record.slot, nbytes)
            else:  # readable until written: a later prompt may share it meanwhile
                payload = record.held = save.buffer[:nbytes]
            self.transfers.enqueue_write(self.disk, record, payload)
        elif record.slot is None:
            self.ledger.remove(save.key)  # no RAM, no disk: nothing holds it
        return record

    def _written(self, record: Record, problem: CacheError | None) -> None:
        """Records a write-through's result (``problem`` None: on disk)."""
        if isinstance(problem, DiskUnavailable):
            self.health.degrade(problem, opened=True)
        ok = problem is None
        culled = self.disk.take_culled() if self.disk is not None else set()
        with self._lock:
            record.pins = max(0, record.pins - 1)
            record.on_disk = record.on_disk or ok
            record.held = None  # on disk now, or lost
            self.written += int(ok)
            if record.slot is None and not record.on_disk:
                self.ledger.remove(record.key)
            elif record.doomed and not record.pins:
                self._forget(record)
            self._forget_culled(culled)

    # forgetting -------------------------------------------------------------------------
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
            self.dropped += 1
        if record.on_disk and self.disk is not None:
            self.transfers.enqueue_delete(self.disk, record.key)

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

    def _forget_culled(self, culled: set[bytes]) -> None:
        """Chunks whose blob diskcache culled are no longer on disk (lock held); one
        being read finds its blob gone and is dropped then (see read)."""
        self.culled += len(culled)
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
        room, health = self.ram, self.health
        with self._lock:
            return StoreStats(
                *(len(self.ledger), room.stats() if room else RamFigures()),
                *(health.stats(disk), self.transfers.pending()),
                evictions=room.evictions if room else 0,
                demotions=room.demotions if room else 0,
                corrupt=self.corrupt,
                disk_full=health.full,
                written=self.written,
                dropped=self.dropped,
                culled=self.culled,
                disk_unavailable=health.unavailable,
                pressure_events=room.pressure_events if room else 0,
                returned_bytes=room.returned_bytes if room else 0,
            )

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
        """Writes what is queued, then stops the writer thread and closes the disk tier."""
        if self._writer.is_alive():
            self.transfers.stop()
            self._writer.join()
        if self.disk is not None:
            self.disk.close()
