"""Turning sampled token bytes into streamed text, honouring stop strings (pure)."""

from __future__ import annotations

import codecs


class TextAssembler:
    """Accumulates token bytes and releases text that can no longer become a stop string.

    ``feed`` returns the text safe to emit now; ``stopped`` turns true once a stop
    string appears (the stop string and what follows are never emitted); ``flush``
    returns what was held back at the end of the reply.
    """

    def __init__(self, stops: tuple[str, ...] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text
        self.text = ""  # everything emitted so far

    def feed(self, data: bytes) -> str:
        if self.stopped:
            return ""
        self._held += self._decoder.decode(data)
        for stop in self._stops:
            idx = self._held.find(stop)
            if idx >= 0:
                self.stopped, self.matched = True, stop
                return self._emit(self._held[:idx], rest="")
        keep = self._longest_stop_prefix_suffix()
        cut = len(self._held) - keep
        return self._emit(self._held[:cut], rest=self._held[cut:])

    def flush(self) -> str:
        if self.stopped:
            return ""
        tail = self._held + self._decoder.decode(b"", final=True)
        return self._emit(tail, rest="")

    def _emit(self, out: str, rest: str) -> str:
        self._held = rest
        self.text += out
        return out

    def _longest_stop_prefix_suffix(self) -> int:
        """Length of the longest suffix of the held text that starts some stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(self._held)), best, -1):
                if self._held.endswith(stop[:n]):
                    best = n
                    break
        return best
