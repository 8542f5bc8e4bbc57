"""The memory panel's data: tier usage and hit rates (polled), and every reply's report."""

from __future__ import annotations

import time
from dataclasses import dataclass

from PySide6.QtCore import QObject, QTimer, Signal

from ...core.memory import MemorySnapshot, parse_stats
from ...core.report import ReplyReport
from ...core.types import SessionSummary
from ..workers import Jobs
from .connection import ConnectionController


@dataclass(frozen=True)
class ReplyPoint:
    """One reply on the TTFT plot."""

    when: float
    conversation: str
    report: ReplyReport


class MemoryController(QObject):
    snapshot = Signal(object)  # MemorySnapshot, or None: not a warmstart server
    sessions = Signal(object)  # list[SessionSummary], or None
    history_changed = Signal(list)  # list[ReplyPoint], oldest first
    last_report = Signal(object)  # ReplyReport

    def __init__(
        self,
        connection: ConnectionController,
        jobs: Jobs,
        *,
        interval_ms: int = 2000,
        history: int = 120,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._connection = connection
        self._jobs = jobs
        self._max = history
        self.points: list[ReplyPoint] = []
        self.latest: MemorySnapshot | None = None
        self._in_flight = 0
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self.refresh)
        connection.became_ready.connect(lambda _h: self.refresh())

    def start(self) -> None:
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    @property
    def polling(self) -> bool:
        return self._in_flight > 0

    def refresh(self) -> None:
        """Poll stats and sessions once (skipped while the previous poll is out)."""
        if self._in_flight or not self._connection.ready:
            return
        backend = self._connection.backend
        self._in_flight = 2
        self._jobs.submit(backend.stats, self._on_stats, self._on_error)
        self._jobs.submit(backend.sessions, self._on_sessions, self._on_error)

    def add_report(self, conversation: str, report: ReplyReport) -> None:
        self.points = [*self.points, ReplyPoint(time.time(), conversation, report)][-self._max :]
        self.history_changed.emit(self.points)
        self.last_report.emit(report)
        self.refresh()

    def recall(self, conversation: str, reports: list[ReplyReport]) -> None:
        """The kept reports of a conversation reopened before this run has a reply of
        its own: the panel shows again what it showed for them (the last reply, the
        plot), not "no reply yet" beside the cache lines of the conversation shown."""
        if self.points or not reports:
            return
        now = time.time()
        self.points = [ReplyPoint(now, conversation, r) for r in reports][-self._max :]
        self.history_changed.emit(self.points)
        self.last_report.emit(reports[-1])

    def _on_stats(self, data: object) -> None:
        self._in_flight -= 1
        self.latest = parse_stats(data) if isinstance(data, dict) else None
        self.snapshot.emit(self.latest)

    def _on_sessions(self, data: list[SessionSummary] | None) -> None:
        self._in_flight -= 1
        self.sessions.emit(data)

    def _on_error(self, exc: BaseException) -> None:
        self._in_flight -= 1
        self._connection.report_error(exc)
