"""llama.cpp's log, through ``logging``: whole lines, each cut short, at a bounded rate.

llama.cpp logs through one process-wide callback (``llama_log_set``), from whichever
thread calls it, in pieces (a line, then "." after "." while a model loads). Left to
itself it writes all of it to stderr; a client that can make it log (a refused
grammar, for one) could then grow the server's log as fast as it sends requests.
Here each line goes to the ``llama.cpp`` logger at a level matching llama.cpp's, at
most ``MAX_LINE_CHARS`` of it, and at most ``BURST`` lines at once and ``RATE_PER_S``
a second after that (a token bucket); the next line let through says how many
were dropped. Lines below the logger's level cost nothing more than being read.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
import time
from collections.abc import Callable

# ggml_log_level (ggml.h): CONT continues the line of the previous call's level
GGML_DEBUG, GGML_INFO, GGML_WARN, GGML_ERROR, GGML_CONT = 1, 2, 3, 4, 5
# llama.cpp's errors are about one request or one call, all reported to the caller
# as return codes (EngineError, a 400): warnings here; its warnings, information
_LEVELS = {GGML_ERROR: logging.WARNING, GGML_WARN: logging.INFO}
# A decode stopped by the abort callback (engine.interrupt: background work that a
# request arrived for, an embedding whose client left) is expected; llama.cpp reports
# it as three errors, recognisable by its status (GGML_STATUS_ABORTED = 1, and
# llama_decode's 2). They are kept, at debug level, so the log does not cry wolf.
_ABORTED_ENDINGS = ("failed with error 1", "compute status: 1", "failed to decode, ret = 2")
MAX_LINE_CHARS = 300  # a log line worth reading; llama.cpp's own are under 200
BURST = 50  # a model load's warnings, and then some
RATE_PER_S = 2.0


class NativeLog:
    """Turns llama.cpp's log calls into log records (thread-safe)."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        line_chars: int = MAX_LINE_CHARS,
        burst: int = BURST,
        rate_per_s: float = RATE_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.line_chars = logger, line_chars
        self.burst, self.rate, self._clock = burst, rate_per_s, clock
        self._lock = threading.Lock()
        self._tokens, self._at = float(burst), clock()
        self.suppressed = 0  # lines dropped since the last one let through
        self._level = logging.DEBUG  # of the line being assembled
        self._line: list[str] = []  # its first pieces, at most line_chars in all
        self._kept = self._cut = 0  # characters in _line; characters dropped from it

    def write(self, ggml_level: int, text: str) -> None:
        """One call of llama.cpp's callback: ``text`` may hold part of a line, one
        line or several."""
        with self._lock:
            if ggml_level != GGML_CONT:
                self._level = _LEVELS.get(ggml_level, logging.DEBUG)
            if not self.logger.isEnabledFor(self._level):
                self._line, self._kept, self._cut = [], 0, 0
                return
            *ended, rest = text.split("\n")
            for piece in ended:
                self._take(piece)
                self._emit()
            self._take(rest)

    def _take(self, piece: str) -> None:
        room = self.line_chars - self._kept
        if room > 0:
            self._line.append(piece[:room])
            self._kept += min(len(piece), room)
        self._cut += max(0, len(piece) - max(room, 0))

    def _emit(self) -> None:
        line, cut = "".join(self._line).rstrip(), self._cut
        self._line, self._kept, self._cut = [], 0, 0
        if not line:
            return
        level = logging.DEBUG if line.endswith(_ABORTED_ENDINGS) else self._level
        if not self.logger.isEnabledFor(level):
            return
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            self.suppressed += 1
            return
        self._tokens -= 1.0
        if self.suppressed:
            self.logger.warning("%d log lines suppressed", self.suppressed)
            self.suppressed = 0
        more = f" [{cut} more characters]" if cut else ""
        # the line as the message (no arguments, so a "%" in it is text): the server's
        # RepeatFilter then counts each line apart, not all of llama.cpp's as one
        self.logger.log(level, line + more)


# llama.cpp holds one callback for the whole process: it is set once, under this lock
# (two threads setting it at once could leave llama.cpp with one nobody keeps alive)
_INSTALLING = threading.Lock()


def install() -> NativeLog:
    """Routes llama.cpp's log (this process's, once) through a NativeLog on the
    ``llama.cpp`` logger. ctypes callbacks take the GIL themselves, so llama.cpp's
    threads may call it; the callback object lives in a cache for good (llama.cpp
    keeps only its address)."""
    with _INSTALLING:
        return _install()


@functools.cache
def _install() -> NativeLog:
    import llama_cpp.llama_cpp as ll

    native = NativeLog(logging.getLogger("llama.cpp"))

    @ll.llama_log_callback
    def _callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        if text:  # NULL arrives as None
            native.write(level, text.decode("utf-8", "replace"))

    native.callback = _callback  # type: ignore[attr-defined]
    ll.llama_log_set(_callback, ctypes.c_void_p(0))
    return native
