"""The disk tier's health: degrade, never die.

A disk tier that cannot be opened (a damaged index, another user's directory) or
stops taking writes (full, read-only) is degraded: the store then serves from RAM
only, says so once per episode (a warning here; the stats, /health and a metric read
``reason``), and tries the tier again every ``retry_s`` seconds on its writer thread:
it opens it again when it never opened, or probes a small write when it did. Once
that works the store takes the tier back and writes through what it captured
meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..errors import DiskFull, DiskUnavailable
from ._disk import DiskTier, DiskUsage
from ._figures import DiskFigures

log = logging.getLogger(__name__)


class DiskHealth:
    def __init__(
        self,
        retry_s: float,
        reopen: Callable[[], DiskTier] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``reopen`` opens the disk tier again (raising DiskUnavailable); without it
        a tier that never opened stays off."""
        self.retry_s = retry_s
        self._reopen, self._clock = reopen, clock
        self._last_try = clock()
        self.degraded = False
        self.reason: str | None = None
        self.unavailable = 0  # times the tier could not be used
        self.full = 0  # ... because its disk was full

    def degrade(self, problem: str | DiskUnavailable, opened: bool) -> None:
        """Stops writes to disk (``opened``: a write to an open tier failed, rather
        than the tier never opening); the warning is said once per episode."""
        self.unavailable += 1
        self.full += isinstance(problem, DiskFull)
        self._last_try = self._clock()
        if not self.degraded:
            hint = "" if opened else "; `warmstart cache clear` resets a damaged cache"
            log.warning(
                "disk tier off: %s. Serving from RAM only; trying the disk again every %.0f s%s",
                problem,
                self.retry_s,
                hint,
            )
        self.degraded, self.reason = True, str(problem)

    def retry_now(self) -> None:
        """Makes the next try due at once (after `warmstart cache clear`)."""
        self._last_try = float("-inf")

    def usable(self, disk: DiskTier | None) -> DiskTier | None:
        """The disk tier once it can write again, opened again if ``disk`` is None;
        None while it is well, not due for a try, or still cannot. Blocking I/O: on
        the store's writer thread."""
        if not self.degraded or self._clock() - self._last_try < self.retry_s:
            return None
        self._last_try = self._clock()
        if disk is not None:
            return disk if disk.writable() else None
        if self._reopen is None:
            return None
        try:
            return self._reopen()
        except DiskUnavailable as exc:
            self.reason = str(exc)
            return None

    def back(self, rewritten: int) -> None:
        """The store took the tier back and queued ``rewritten`` chunks for it."""
        self.degraded, self.reason = False, None
        log.warning("disk tier back: writing to the disk cache again (%d chunks)", rewritten)

    def stats(self, usage: DiskUsage) -> DiskFigures:
        """The tier's own counts (``DiskTier.usage``), and whether it is off and why."""
        fields = (usage.chunks, usage.tokens, usage.kv_bytes, usage.used_bytes)
        return DiskFigures(*fields, degraded=self.degraded, degraded_reason=self.reason)
