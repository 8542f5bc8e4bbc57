"""A good citizen on a desktop: the RAM pool gives memory back when the system runs short.

A watcher thread looks at the system's available memory every ``interval_s``.
Below the floor (the policy's ``memory_floor_bytes``) the pool's limit drops by
the shortfall: its coldest chunks leave RAM (they stay on disk, or, with the disk
tier off, are dropped: a later recompute) and their pages go back to the OS.
Above the floor the limit rises again, by half the room above it at a time, so
the pool's own growth never takes the system back down to the floor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from ._room import RamRoom

log = logging.getLogger(__name__)
MiB = 1 << 20

ReadAvailable = Callable[[], int | None]


def read_available() -> int | None:
    """The system's available memory in bytes: MemAvailable on Linux (free pages plus
    the page cache the kernel can reclaim, unlike MemFree), psutil's figure elsewhere."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(psutil.virtual_memory().available)
    except Exception:  # no figure at all: the watcher just does nothing this time
        return None


def next_limit(available: int, floor: int, resident: int, limit: int, capacity: int) -> int:
    """The pool's next limit in bytes (pure).

    Below the floor: what the pool holds (or its limit, if lower) minus the shortfall.
    At or above it: grown towards the capacity by half the room above the floor, and
    never lowered."""
    if available < floor:
        return max(0, min(limit, resident) - (floor - available))
    return min(capacity, max(limit, resident + (available - floor) // 2))


class MemoryWatcher:
    """Shrinks and regrows ``target``'s pool around ``floor_bytes`` of available memory.

    :meth:`check` is one look (tests call it with a fake ``read``); :meth:`start` runs
    it every ``interval_s`` on a daemon thread until ``stop`` is set."""

    def __init__(
        self,
        target: RamRoom,
        floor_bytes: int,
        interval_s: float = 1.0,
        read: ReadAvailable = read_available,
    ) -> None:
        self.target, self.floor, self.interval_s = target, floor_bytes, interval_s
        self._read = read
        self.available: int | None = None  # the last reading
        self.under_pressure = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="memory-watcher", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread.ident is not None:
            self.thread.join()

    def _run(self) -> None:
        while not self.stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # a bad reading must not end the watcher for good
                log.exception("memory watcher: check failed")

    def check(self) -> None:
        available = self._read()
        self.available = available
        if available is None or self.floor <= 0:
            return
        resident, limit, capacity = self.target.figures()
        wanted = next_limit(available, self.floor, resident, limit, capacity)
        if available < self.floor:
            if resident > wanted or limit > wanted:
                freed = self.target.shrink(wanted)
                self._say_pressure(available, wanted, freed)
            self.under_pressure = True
            return
        if wanted > limit:
            self.target.grow(wanted)
            if self.under_pressure:
                log.info(
                    "memory back (%d MiB available): the RAM cache may grow to %d MiB",
                    available // MiB,
                    wanted // MiB,
                )
        self.under_pressure = False

    def _say_pressure(self, available: int, limit: int, freed: int) -> None:
        """Warns once an episode; the later shrinks of the same episode log at debug."""
        say = log.debug if self.under_pressure else log.warning
        say(
            "memory low (%d MiB available, floor %d MiB): RAM cache limited to %d MiB, "
            "%d MiB given back to the system; cold chunks answer from disk",
            available // MiB,
            self.floor // MiB,
            limit // MiB,
            freed // MiB,
        )
