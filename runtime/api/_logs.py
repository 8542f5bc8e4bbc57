"""A log that cannot grow without bound: repeats of one message are rate-limited.

Under a flood (descriptors exhausted, thousands of clients failing the same way)
the same message arrived thousands of times a second and the log grew megabytes a
second. A message (logger, level, format string) passes at most ``burst`` times per
``window`` seconds; the first one let through after a quiet spell says how many
were dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

_KEY_LIMIT = 4096  # distinct messages remembered; beyond it the table starts afresh


class RepeatFilter(logging.Filter):
    def __init__(
        self, burst: int = 10, window: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.burst, self.window, self._clock = burst, window, clock
        self._seen: dict[tuple[str, int, str], tuple[float, int, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        start, passed, dropped = self._seen.get(key, (now, 0, 0))
        if now - start >= self.window:
            start, passed = now, 0
            if dropped:
                record.msg = f"{record.msg} [{dropped} similar messages suppressed]"
                dropped = 0
        if passed >= self.burst:
            self._remember(key, (start, passed, dropped + 1))
            return False
        self._remember(key, (start, passed + 1, dropped))
        return True

    def _remember(self, key: tuple[str, int, str], value: tuple[float, int, int]) -> None:
        if len(self._seen) >= _KEY_LIMIT and key not in self._seen:
            self._seen.clear()
        self._seen[key] = value


def install(
    logger_names: Iterable[str] = ("", "uvicorn", "uvicorn.error", "uvicorn.access"),
) -> RepeatFilter:
    """Adds one RepeatFilter to every handler of these loggers (handler filters see
    the records propagated from child loggers too, such as asyncio's)."""
    repeat = RepeatFilter()
    for name in logger_names:
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, RepeatFilter) for f in handler.filters):
                handler.addFilter(repeat)
    return repeat
