"""Running network and process work off the GUI thread.

``Jobs.submit(fn, on_done, on_error)`` runs ``fn`` on a ``QThreadPool`` thread; the
callbacks run on the GUI thread (the signals are emitted from the worker thread and
delivered through queued connections to ``Jobs``, which lives on the GUI thread).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QThreadPool, Signal

from ..core.types import ChatStream, Finished, TextDelta

log = logging.getLogger(__name__)
OnDone = Callable[[Any], None]
OnError = Callable[[BaseException], None]


class Jobs(QObject):
    _done = Signal(int, object)
    _failed = Signal(int, object)

    def __init__(self, parent: QObject | None = None, max_threads: int = 4) -> None:
        super().__init__(parent)
        self.pool = QThreadPool(self)
        self.pool.setMaxThreadCount(max_threads)
        self._ids = itertools.count()
        self._callbacks: dict[int, tuple[OnDone | None, OnError | None]] = {}
        self._done.connect(self._on_done)
        self._failed.connect(self._on_failed)

    def submit(
        self, fn: Callable[[], Any], on_done: OnDone | None = None, on_error: OnError | None = None
    ) -> None:
        job = next(self._ids)
        self._callbacks[job] = (on_done, on_error)

        def run() -> None:
            try:
                result = fn()
            except Exception as exc:  # delivered to on_error on the GUI thread
                self._failed.emit(job, exc)
            else:
                self._done.emit(job, result)

        self.pool.start(run)

    def _on_done(self, job: int, result: Any) -> None:
        on_done, _ = self._callbacks.pop(job, (None, None))
        if on_done:
            on_done(result)

    def _on_failed(self, job: int, exc: BaseException) -> None:
        _, on_error = self._callbacks.pop(job, (None, None))
        if on_error:
            on_error(exc)
        else:
            log.warning("background job failed: %s", exc, exc_info=exc)

    def wait(self, msecs: int = -1) -> bool:
        return self.pool.waitForDone(msecs)

    def forget(self) -> None:
        """Drops the callbacks of the jobs still out, or whose answers are still queued:
        once the window is gone, those answers have nobody to go to."""
        self._callbacks.clear()


class StreamRunner(QObject):
    """Iterates one :class:`ChatStream` on a pool thread; signals arrive on the GUI thread."""

    delta = Signal(str)
    finished = Signal(object)  # ReplyReport
    failed = Signal(object)  # BaseException

    def __init__(self, stream: ChatStream, pool: QThreadPool, parent: QObject | None = None):
        super().__init__(parent)
        self.stream = stream
        self._pool = pool

    def start(self) -> None:
        self._pool.start(self._run)

    def cancel(self) -> None:
        self.stream.cancel()

    def _run(self) -> None:
        try:
            for event in self.stream:
                if isinstance(event, TextDelta):
                    self.delta.emit(event.text)
                elif isinstance(event, Finished):
                    self.finished.emit(event.report)
        except Exception as exc:  # shown to the user by the controller
            self.failed.emit(exc)
