"""Reading one chat turn from a terminal: a line, a pasted block, or a \"\"\" block.

A terminal without bracketed paste (or with it off) delivers a pasted block as
lines typed very fast: after the first line, the rest is already waiting on
stdin. Those lines belong to the same turn. (With bracketed paste on, readline
already returns the whole block as one string.) A line that opens with \"\"\"
starts an explicit block, ended by a line that ends with \"\"\".
"""

from __future__ import annotations

import select
from collections.abc import Callable

FENCE = '"""'
PASTE_GAP_S = 0.015  # lines arriving closer than this were pasted, not typed
MORE_PROMPT = "... "


def waiting_on(fd: int, gap_s: float = PASTE_GAP_S) -> Callable[[], bool]:
    """Whether more input arrives on ``fd`` within ``gap_s``: only meaningful where
    nothing reads ahead of us (a terminal read by readline, one byte at a time)."""

    def more() -> bool:
        try:
            ready, _, _ = select.select([fd], [], [], gap_s)
        except (OSError, ValueError):  # closed, or not selectable (Windows consoles)
            return False
        return bool(ready)

    return more


class TurnReader:
    """``reader(prompt)`` returns one turn's text; EOFError when input ends first.

    ``read_line`` is input() (readline's when loaded); ``more`` says whether another
    line is already waiting (never, by default: every line is a turn)."""

    def __init__(
        self,
        read_line: Callable[[str], str] = input,
        more: Callable[[], bool] = lambda: False,
    ) -> None:
        self.read_line, self.more = read_line, more

    def __call__(self, prompt: str) -> str:
        first = self.read_line(prompt)
        if first.lstrip().startswith(FENCE):
            return self._block(first.strip()[len(FENCE) :])
        lines = [first]
        while self.more():
            try:
                lines.append(self.read_line(""))
            except EOFError:  # the paste was the end of the input
                break
        return "\n".join(lines)

    def _block(self, rest: str) -> str:
        """The lines up to the closing fence (the text on the fence lines included)."""
        if rest.endswith(FENCE):  # \"\"\"one line\"\"\"
            return rest[: -len(FENCE)]
        lines = [rest] if rest else []
        while True:
            try:
                line = self.read_line(MORE_PROMPT)
            except EOFError:  # an unclosed block still counts
                return "\n".join(lines)
            if line.rstrip().endswith(FENCE):
                last = line.rstrip()[: -len(FENCE)]
                return "\n".join([*lines, last] if last else lines)
            lines.append(line)
