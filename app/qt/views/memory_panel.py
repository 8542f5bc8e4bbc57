"""The memory panel: tier bars, hit rates, the last reply's report, a TTFT plot."""

from __future__ import annotations

import itertools
import math

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QLabel,
    QProgressBar,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from ...core.memory import MemorySnapshot, TierUsage
from ...core.report import TIERS, ReplyReport, format_bytes, format_degraded, format_status
from ..controllers.memory import ReplyPoint
from ..models import LOCATION_COLORS

TIER_TITLES = {"live": "Live context", "ram": "RAM pool", "disk": "Disk"}
DEGRADED_COLOR = "#c0392b"  # reads on the light and the dark theme


def axis_top(highest: float) -> float:
    """The top of the y axis: a round number (1, 2 or 5 times a power of ten) above
    ``highest`` with some room, so that its half is a round number too."""
    want = max(highest * 1.1, 1.0)
    power = 10.0 ** math.floor(math.log10(want))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= want)


def tick_label(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:g}"


class TtftPlot(QWidget):
    """Time to first token of the recent replies, one dot per reply, coloured by the
    tier its prompt came from (grey: recomputed)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.points: list[ReplyPoint] = []
        self.setMinimumHeight(150)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def set_points(self, points: list[ReplyPoint]) -> None:
        self.points = [p for p in points if p.report.ttft_ms is not None][-60:]
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        text, grid = pal.text().color(), pal.mid().color()
        area = QRectF(self.rect()).adjusted(44, 8, -8, -20)
        painter.setPen(QPen(grid, 1))
        painter.drawRect(area)
        values = [float(p.report.ttft_ms or 0.0) for p in self.points]
        painter.setPen(text)
        font = painter.font()
        font.setPointSizeF(max(6.0, font.pointSizeF() * 0.8))
        painter.setFont(font)
        painter.drawText(
            QRectF(area.left(), area.bottom() + 2, area.width(), 16),
            Qt.AlignmentFlag.AlignCenter,
            "time to first token (ms), last replies",
        )
        if not values:
            # no scale without a value: an axis of "1, 1, 0" ms reads as a measurement
            painter.drawText(
                area.adjusted(8, 0, -8, 0),
                Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap,
                "No replies yet.\nEach reply's time to first token shows here.",
            )
            painter.end()
            return
        top = axis_top(max(values))
        for frac in (0.0, 0.5, 1.0):
            y = area.bottom() - frac * area.height()
            painter.drawText(
                QRectF(0, y - 8, 40, 16), Qt.AlignmentFlag.AlignRight, tick_label(top * frac)
            )
        step = area.width() / max(1, len(values) - 1) if len(values) > 1 else 0.0
        xy = [
            QPointF(
                area.left() + (i * step if step else area.width() / 2),
                area.bottom() - v / top * area.height(),
            )
            for i, v in enumerate(values)
        ]
        line = QColor(text)
        line.setAlpha(110)  # a muted text colour reads on light and dark themes alike
        painter.setPen(QPen(line, 1.5))
        for a, b in itertools.pairwise(xy):
            painter.drawLine(a, b)
        for point, dot in zip(self.points, xy, strict=True):
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(LOCATION_COLORS[point.report.hit_tier]))
            painter.drawEllipse(dot, 4.0, 4.0)
        painter.end()


class MemoryPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumWidth(300)
        layout = QVBoxLayout(self)
        self.unsupported = QLabel(
            "This server does not report its cache (a plain OpenAI-compatible server, "
            "such as vLLM), so only token counts are shown."
        )
        self.unsupported.setWordWrap(True)
        self.unsupported.setObjectName("muted")
        self.unsupported.hide()
        layout.addWidget(self.unsupported)
        # Part of the cache is off (the disk full, read-only, damaged): said at the top,
        # in the warning colour, with the server's reason.
        self.degraded = QLabel("")
        self.degraded.setObjectName("degraded")
        self.degraded.setWordWrap(True)
        self.degraded.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.degraded.setStyleSheet(f"color: {DEGRADED_COLOR}; font-weight: bold;")
        self.degraded.hide()
        layout.addWidget(self.degraded)
        self.tiers_box = QFrame()
        grid = QGridLayout(self.tiers_box)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setColumnStretch(1, 1)
        self.bars: dict[str, QProgressBar] = {}
        self.hit_labels: dict[str, QLabel] = {}
        for row, tier in enumerate(TIERS):
            name = QLabel(TIER_TITLES[tier])
            dot = QLabel("●")
            dot.setStyleSheet(f"color: {LOCATION_COLORS[tier]};")
            bar = QProgressBar()
            bar.setRange(0, 1000)
            bar.setFormat("–")
            hits = QLabel("hit rate –")
            hits.setObjectName("muted")
            grid.addWidget(dot, 2 * row, 0)
            grid.addWidget(name, 2 * row, 1)
            grid.addWidget(hits, 2 * row, 2, Qt.AlignmentFlag.AlignRight)
            grid.addWidget(bar, 2 * row + 1, 0, 1, 3)
            self.bars[tier], self.hit_labels[tier] = bar, hits
        layout.addWidget(self.tiers_box)
        self.misses = QLabel("")
        self.misses.setObjectName("muted")
        layout.addWidget(self.misses)
        layout.addWidget(self._heading("Last reply"))
        self.last = QLabel("No reply yet.")
        self.last.setWordWrap(True)
        self.last.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.last)
        self.location = QLabel("")
        self.location.setObjectName("muted")
        self.location.setWordWrap(True)
        layout.addWidget(self.location)
        layout.addWidget(self._heading("Time to first token"))
        self.plot = TtftPlot()
        layout.addWidget(self.plot, 1)

    @staticmethod
    def _heading(text: str) -> QLabel:
        label = QLabel(text)
        font = label.font()
        font.setBold(True)
        label.setFont(font)
        return label

    def set_snapshot(self, snap: MemorySnapshot | None) -> None:
        self.unsupported.setVisible(snap is None)
        self.tiers_box.setVisible(snap is not None)
        self.misses.setVisible(snap is not None)
        warning = format_degraded(snap.degraded) if snap is not None else ""
        self.degraded.setText(f"⚠ {warning}" if warning else "")
        self.degraded.setVisible(bool(warning))
        if snap is None:
            return
        for tier in TIERS:
            usage = snap.tiers.get(tier)
            bar = self.bars[tier]
            bar.setValue(round((usage.fill or 0.0) * 1000) if usage else 0)
            bar.setFormat(self._usage_text(usage))
            rate = snap.hit_rate(tier)
            self.hit_labels[tier].setText(
                "hit rate –"
                if rate is None
                else f"hit rate {rate:.0%} ({usage.hits if usage else 0})"
            )
        self.misses.setText(f"{snap.lookups:,} lookups, {snap.misses:,} recomputed from scratch")

    @staticmethod
    def _usage_text(usage: TierUsage | None) -> str:
        if usage is None:
            return "–"
        if usage.capacity_bytes > 0:
            return f"{format_bytes(usage.used_bytes)} of {format_bytes(usage.capacity_bytes)}"
        parts = []
        if usage.capacity_sessions > 0:
            parts.append(f"{usage.sessions} of {usage.capacity_sessions} conversations")
        if usage.tokens:
            parts.append(f"{usage.tokens:,} tokens")
        parts.append(format_bytes(usage.used_bytes))
        return " · ".join(parts)

    def set_last_report(self, report: ReplyReport) -> None:
        text = format_status(report)
        if report.decision:
            text += f"\ndecision: {report.decision}"
        self.last.setText(text)

    def set_history(self, points: list[ReplyPoint]) -> None:
        self.plot.set_points(points)

    def set_location(self, text: str) -> None:
        self.location.setText(text)
