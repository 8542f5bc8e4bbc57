"""Progress for the CLI, through rich: a bar on a terminal, and nothing but log lines
(no carriage returns) when stderr is a file, a pipe or a journal."""

from __future__ import annotations

import logging
import sys
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

log = logging.getLogger(__name__)


class Bar:
    """``with Bar("calibrating", total) as bar: bar.update(done, "what")``."""

    def __init__(self, title: str, total: float, stream: TextIO | None = None) -> None:
        self.title, self.total = title, total
        stream = stream if stream is not None else sys.stderr
        self._live = stream.isatty()
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if self._live:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[what]}"),
                console=Console(file=stream),
                transient=False,
            )

    def __enter__(self) -> Bar:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task(self.title, total=self.total, what="")
        return self

    def update(self, done: float, what: str = "") -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=done, what=what)
        else:
            log.info("%s: %s (%.0f%%)", self.title, what, 100 * done / max(self.total, 1e-9))

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()


class ProgressLine:
    """A calibration progress callback ``(what, done 0..1)``: a rich bar on a terminal,
    log lines only when ``stream`` is not one (no carriage returns in logs). With
    ``lines`` (doctor's), off a terminal each step is a plain line of ``stream``:
    someone is waiting for that output, and a minute of silence looks like a hang."""

    def __init__(self, stream: TextIO, lines: bool = False) -> None:
        self._bar = Bar("calibrating", 1.0, stream)
        self._started = False
        self._stream = stream if lines and not stream.isatty() else None

    def __call__(self, what: str, done: float) -> None:
        if self._stream is not None:
            print(f"calibrating: {what} ({min(max(done, 0.0), 1.0):.0%})", file=self._stream)
            self._stream.flush()
            return
        if not self._started:
            self._bar.__enter__()
            self._started = True
        self._bar.update(min(max(done, 0.0), 1.0), what)
        if done >= 1.0:
            self._bar.__exit__(None, None, None)
            self._started = False
