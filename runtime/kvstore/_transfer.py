"""The transfers: they move chunk bytes between the tiers, and plan nothing.

The store (``_store.TieredStore``) owns them, decides which chunks move, from where
to where and what is pinned meanwhile, and calls them; they never call the store:
each move's result is their return value, which the store records.

- Disk reads run on the caller's thread, because a restore waits for those bytes
  (``read``: into the memory the store chose).
- Write-throughs and deletions are queued (``enqueue_write``, ``enqueue_delete``)
  and run in that order by the store's writer thread (``next``, ``write``,
  ``delete``, ``done``), so the user never waits for them. A write waits while a
  request is being prefilled or decoded (``hold``), at most ``HOLD_S``: where the
  engine's threads fill the cores, compressing a chunk beside them would slow every
  one of their steps.

The engine moves the bytes between the context and the pool itself (``cut`` into a
reserved slot, ``restore`` from pool views).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CacheError, DiskUnavailable
from ._index import IndexRow

if TYPE_CHECKING:
    from ._disk import DiskTier
    from ._ledger import Record

log = logging.getLogger(__name__)

HOLD_S = 2.0  # the longest a write waits for the engine to be quiet


@dataclass(frozen=True)
class Write:
    """Write ``record``'s bytes (``payload``, kept at ``kept_at``) through to ``disk``."""

    disk: DiskTier
    record: Record
    payload: np.ndarray
    kept_at: float


@dataclass(frozen=True)
class Delete:
    disk: DiskTier
    key: bytes


@dataclass(frozen=True)
class Turn:
    """A turn of the writer with nothing to move: a wake-up, or its last (``stop``)."""

    stop: bool = False


Job = Write | Delete | Turn


class Transfers:
    def __init__(self, durable_s: float = math.inf) -> None:
        """``durable_s``: a write waits for a quiet engine until half of it has passed
        since its chunk was kept, no longer (``_hold_write``)."""
        self.durable_s = durable_s
        self._queue: queue.Queue[Job] = queue.Queue()
        self._quiet = threading.Event()  # no request is being prefilled or decoded
        self._quiet.set()
        self._flushing = 0  # callers waiting in flush(): the writes go at once

    # reads: on the caller's thread ---------------------------------------------------
    @staticmethod
    def read(
        disk: DiskTier, key: bytes, out: np.ndarray, logits: int = 0
    ) -> tuple[int | None, bool]:
        """Reads chunk ``key`` (whose payload ends with ``logits`` bytes of logits) from
        ``disk`` into ``out``: (bytes read, None when the blob is gone; whether it proved
        corrupt, and was deleted)."""
        try:
            return disk.read_into(key, out, logits), False
        except CacheError as exc:
            log.warning("dropping chunk %s: %s", key.hex()[:12], exc)
            return None, True

    # writes: queued here, run by the store's writer thread ---------------------------
    def enqueue_write(self, disk: DiskTier, record: Record, payload: np.ndarray) -> None:
        """Queues the chunk's write-through (the store pins it until the result)."""
        self._queue.put(Write(disk, record, payload, time.monotonic()))

    def enqueue_delete(self, disk: DiskTier, key: bytes) -> None:
        self._queue.put(Delete(disk, key))

    def wake(self) -> None:
        """A turn of the writer now (the store tries a degraded disk tier again)."""
        self._queue.put(Turn())

    def stop(self) -> None:
        """The writer's last turn, after what is queued (written at once now)."""
        self._quiet.set()
        self._queue.put(Turn(stop=True))

    def next(self, timeout: float) -> Job | None:
        """The next job, None when none came within ``timeout``; a write once the
        engine is quiet (``_hold_write``). ``done()`` after each job."""
        try:
            job = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(job, Write):
            self._hold_write(job.kept_at)
        return job

    def done(self) -> None:
        self._queue.task_done()

    @staticmethod
    def write(job: Write) -> CacheError | None:
        """Writes the chunk through; the problem when it could not (DiskUnavailable:
        the tier cannot take writes at all)."""
        r = job.record
        try:
            row = IndexRow(r.key, r.parent, r.start, r.tokens, r.nbytes, r.logits)
            job.disk.put(row, job.payload.data)
        except CacheError as exc:
            if not isinstance(exc, DiskUnavailable):
                log.warning("%s", exc)
            return exc
        return None

    @staticmethod
    def delete(job: Delete) -> None:
        job.disk.delete(job.key)

    # when writes go ------------------------------------------------------------------
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

    def wait_quiet(self, give_up: Callable[[], bool]) -> None:
        """Until no request is computed, or ``give_up()``."""
        while not (self._quiet.is_set() or give_up()):
            self._quiet.wait(0.05)

    def _hold_write(self, kept_at: float) -> None:
        """Until no request is computed, a flush waits, or HOLD_S have passed; never
        past half of ``durable_s`` after the chunk was kept (``kept_at``): under a
        steady load every write would wait its HOLD_S, one after another, and a burst
        of chats' chunks would reach the disk minutes late."""
        deadline = min(time.monotonic() + HOLD_S, kept_at + self.durable_s / 2)
        self.wait_quiet(lambda: bool(self._flushing) or time.monotonic() >= deadline)
