"""Qt item models. They hold rows and answer roles; they do no I/O."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor, QFont, QIcon, QPainter, QPixmap

from ..core.report import TIER_LABELS
from ..core.store import Conversation
from ..core.types import SessionSummary

Index = QModelIndex | QPersistentModelIndex
LOCATION_COLORS = {"live": "#2e9d4f", "ram": "#2f7fd8", "disk": "#c98a1b", "none": "#8a8a8a"}
LOCATION_SHORT = {"live": "live", "ram": "RAM", "disk": "disk", "none": "–"}


class Roles(IntEnum):
    Id = Qt.ItemDataRole.UserRole + 1
    Pinned = Qt.ItemDataRole.UserRole + 2
    Location = Qt.ItemDataRole.UserRole + 3
    CachedTokens = Qt.ItemDataRole.UserRole + 4
    Updated = Qt.ItemDataRole.UserRole + 5


BADGE_SIZE = (44, 20)  # the conversation list's icon size: a smaller one scales it down


def location_badge(location: str) -> QIcon:
    """A pill naming the tier that holds a conversation's KV, readable at a glance:
    white bold text of 11 px on the tier's colour."""
    width, height = BADGE_SIZE
    pixmap = QPixmap(width, height)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor(LOCATION_COLORS.get(location, LOCATION_COLORS["none"])))
    painter.drawRoundedRect(0, 1, width, height - 2, (height - 2) / 2, (height - 2) / 2)
    font = QFont()
    font.setPixelSize(11)
    font.setBold(True)
    painter.setFont(font)
    painter.setPen(QColor("white"))
    painter.drawText(pixmap.rect(), Qt.AlignmentFlag.AlignCenter, LOCATION_SHORT.get(location, "?"))
    painter.end()
    return QIcon(pixmap)


class ConversationListModel(QAbstractListModel):
    """The conversation list: the store's rows, plus where the server keeps each one's KV."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._rows: list[Conversation] = []
        self._sessions: dict[str, SessionSummary] = {}
        self._badges: dict[str, QIcon] = {}

    # -- feeding ---------------------------------------------------------------------

    def set_conversations(self, conversations: list[Conversation]) -> None:
        self.beginResetModel()
        self._rows = list(conversations)
        self.endResetModel()

    def set_sessions(self, sessions: list[SessionSummary] | None) -> None:
        """Where each conversation's cache lives; ``None`` (not a warmstart server) clears."""
        new = {s.id: s for s in sessions or []}
        if new == self._sessions:
            return
        self._sessions = new
        if self._rows:
            roles = [Roles.Location, Qt.ItemDataRole.DecorationRole, Qt.ItemDataRole.ToolTipRole]
            self.dataChanged.emit(self.index(0), self.index(len(self._rows) - 1), roles)

    # -- reading ---------------------------------------------------------------------

    def conversation(self, row: int) -> Conversation | None:
        return self._rows[row] if 0 <= row < len(self._rows) else None

    def row_of(self, cid: str) -> int:
        return next((i for i, c in enumerate(self._rows) if c.id == cid), -1)

    def location(self, cid: str) -> str:
        session = self._sessions.get(cid)
        return session.location if session else "none"

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        conv = self.conversation(index.row()) if index.isValid() else None
        if conv is None:
            return None
        location = self.location(conv.id)
        if role == Qt.ItemDataRole.DisplayRole:
            return conv.title
        if role == Roles.Id:
            return conv.id
        if role == Roles.Pinned:
            return conv.pinned
        if role == Roles.Location:
            return location
        if role == Roles.CachedTokens:
            session = self._sessions.get(conv.id)
            return session.n_tokens if session else 0
        if role == Roles.Updated:
            return conv.updated
        if role == Qt.ItemDataRole.DecorationRole:
            if location not in self._badges:
                self._badges[location] = location_badge(location)
            return self._badges[location]
        if role == Qt.ItemDataRole.FontRole and conv.pinned:
            font = QFont()
            font.setBold(True)
            return font
        if role == Qt.ItemDataRole.ToolTipRole:
            session = self._sessions.get(conv.id)
            cache = f"cache: {TIER_LABELS[location]}"
            if session and session.n_tokens:
                cache += f" ({session.n_tokens:,} tokens)"
            return f"{conv.title}\n{cache}" + ("\npinned" if conv.pinned else "")
        return None
