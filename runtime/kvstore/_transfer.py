"""The transfer worker: moves chunk bytes between the tiers and reports to the store.

The store (``_store.TieredStore``) plans: which chunks, where their bytes are, where
they go, what is pinned meanwhile. This worker moves them:

- disk -> staging or a RAM pool slot, on the caller's thread, because a restore
  waits for those bytes (``load``, ``read``, ``promote``);
- RAM -> disk and deletions, in the background on its own thread (``kv-writer``),
  in the order asked, so the user never waits for a write-through; a write waits
  while a request is being prefilled or decoded (``hold``), at most ``HOLD_S``:
  where the engine's threads fill the cores, compressing a chunk beside them would
  slow every one of their steps.

Each move ends with a report (``end_read``, ``written``) through which the store
lands, keeps or forgets the chunk. The engine moves the bytes between the context
and the pool itself (``cut`` into a reserved slot, ``restore`` from pool views).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import CacheError, DiskUnavailable
from ._index import IndexRow
from ._plans import LoadPlan

if TYPE_CHECKING:
    from ._disk import DiskTier
    from ._ledger import Record
    from ._store import TieredStore

log = logging.getLogger(__name__)

HOLD_S = 2.0  # the longest a write waits for the engine to be quiet


class Transfers:
    def __init__(self, store: TieredStore) -> None:
        self._store = store
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="kv-writer", daemon=True)
        self._quiet = threading.Event()  # no request is being prefilled or decoded
        self._quiet.set()
        self._flushing = 0  # callers waiting in flush(): the writes go at once

    def start(self) -> None:
        self._thread.start()

    # reads: on the caller's thread ---------------------------------------------------
    def load(self, plan: LoadPlan, staging: np.ndarray | None = None) -> list[np.ndarray]:
        """The plan's chunk bytes in order, stopping at the first one gone or corrupt:
        RAM chunks as pool views, disk chunks read where the plan put them."""
        blobs = []
        for load, record in zip(plan.loads, plan.records, strict=True):
            room = None
            if load.offset is not None and staging is not None:
                room = staging[load.offset : load.offset + load.nbytes]
            blob = self.read(record, room)
            if blob is None:
                break
            blobs.append(blob)
        return blobs

    def read(self, record: Record, staging: np.ndarray | None = None) -> np.ndarray | None:
        """One chunk's bytes from the fastest tier (None: gone, or proved corrupt and
        dropped). A disk read lands in ``staging`` when given, else in the slot the
        store gives it (reading it promotes it, with no extra copy)."""
        read = self._store.begin_read(record, staging)
        if read is None or read.ready is not None:
            return None if read is None else read.ready
        disk: DiskTier | None = self._store.disk
        corrupt, n = False, None
        if disk is not None and read.buffer is not None:
            try:
                n = disk.read_into(record.key, read.buffer)
            except CacheError as exc:
                log.warning("dropping chunk %s: %s", record.key.hex()[:12], exc)
                corrupt = True
        return self._store.end_read(record, read, n, corrupt)

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
                self._wait_quiet(lambda: stop is not None and stop.is_set())
            if stop is not None and stop.is_set():
                break
            verdict = self._store.may_promote(record, make_room)
            if verdict is None:  # no room for any of them
                break
            if verdict and self.read(record) is not None and record.slot is not None:
                tokens += len(record.tokens)
        return tokens

    # writes: on the writer thread ----------------------------------------------------
    def write(self, record: Record, payload: np.ndarray) -> None:
        """Writes the chunk through (it is pinned by the store until ``written``)."""
        self._queue.put(("put", (record, payload, time.monotonic())))

    def delete(self, key: bytes) -> None:
        self._queue.put(("delete", key))

    def hold(self, busy: bool) -> None:
        """A request is being prefilled or decoded (``busy``), or none is any more:
        writes wait for the engine to be quiet, at most ``HOLD_S`` each."""
        if busy:
            self._quiet.clear()
        else:
            self._quiet.set()

    @property
    def quiet(self) -> bool:
        """No request is being computed: writes go at once."""
        return self._quiet.is_set()

    def wake(self) -> None:
        """A turn of the writer now (it tries a degraded disk tier again)."""
        self._queue.put(("noop", None))

    def pending(self) -> int:
        return self._queue.qsize()

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every write and deletion asked for so far is done (they go at
        once meanwhile, busy engine or not); False when ``timeout`` ran out first."""
        done = self._queue.all_tasks_done
        self._flushing += 1
        try:
            with done:
                return done.wait_for(lambda: not self._queue.unfinished_tasks, timeout)
        finally:
            self._flushing -= 1

    def _wait_quiet(self, give_up: Callable[[], bool]) -> None:
        """Until no request is computed, or ``give_up()``."""
        while not (self._quiet.is_set() or give_up()):
            self._quiet.wait(0.05)

    def _hold_write(self, kept_at: float) -> None:
        """Until no request is computed, a flush waits, or HOLD_S have passed; never
        past half of the store's ``durable_s`` after the chunk was kept (``kept_at``):
        under a steady load every write would wait its HOLD_S, one after another, and
        a burst of chats' chunks would reach the disk minutes late."""
        deadline = min(time.monotonic() + HOLD_S, kept_at + self._store.durable_s / 2)
        self._wait_quiet(lambda: bool(self._flushing) or time.monotonic() >= deadline)

    def close(self) -> None:
        self._quiet.set()  # what is queued is written now
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _loop(self) -> None:
        store = self._store
        while True:
            try:
                item = self._queue.get(timeout=store.retry_s)
            except queue.Empty:
                store.maybe_recover()
                continue
            store.maybe_recover()
            try:
                if item is None:
                    return
                op, arg = item
                if op == "put":
                    record, payload, kept_at = arg
                    self._hold_write(kept_at)
                    self._write_one(record, payload)
                elif op == "delete" and store.disk is not None:
                    store.disk.delete(arg)
            except Exception:  # the writer must outlive any one bad chunk
                log.exception("background cache write failed")
            finally:
                self._queue.task_done()

    def _write_one(self, record: Record, payload: np.ndarray) -> None:
        disk: DiskTier | None = self._store.disk
        assert disk is not None
        problem: CacheError | None = None
        try:
            row = IndexRow(record.key, record.parent, record.start, record.tokens, record.nbytes)
            disk.put(row, payload.data)
        except CacheError as exc:  # DiskUnavailable included: the store degrades
            problem = exc
            if not isinstance(exc, DiskUnavailable):
                log.warning("%s", exc)
        self._store.written(record, problem)
