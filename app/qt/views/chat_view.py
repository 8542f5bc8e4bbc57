"""The message view and the composer. Layout only: every action leaves as a signal."""

from __future__ import annotations

import math

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent, QTextBlockFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ...core.report import format_status
from ...core.store import StoredMessage
from ..theme import code_background

ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}


class MessageBubble(QFrame):
    copy_clicked = Signal(str)
    edit_clicked = Signal()
    regenerate_clicked = Signal()

    def __init__(self, role: str, scheme: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.role = role
        self.text = ""
        self._scheme = scheme
        self.setObjectName("bubble_user" if role == "user" else "bubble_assistant")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        header = QHBoxLayout()
        name = QLabel(ROLE_NAMES.get(role, role))
        name.setObjectName("role")
        header.addWidget(name)
        header.addStretch(1)
        self.copy_button = self._flat("Copy", lambda: self.copy_clicked.emit(self.text))
        self.edit_button = self._flat("Edit", lambda: self.edit_clicked.emit())
        self.regenerate_button = self._flat("Regenerate", lambda: self.regenerate_clicked.emit())
        for b in (self.edit_button, self.regenerate_button, self.copy_button):
            header.addWidget(b)
        self.edit_button.hide()
        self.regenerate_button.hide()
        layout.addLayout(header)
        self.body = QTextBrowser()
        self.body.setOpenExternalLinks(True)
        self.body.setFrameShape(QFrame.Shape.NoFrame)
        self.body.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.body.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.body.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        layout.addWidget(self.body)
        self.footer = QLabel()
        self.footer.setObjectName("muted")
        self.footer.setWordWrap(True)
        self.footer.hide()
        layout.addWidget(self.footer)

    def _flat(self, text: str, slot: object) -> QToolButton:
        button = QToolButton()
        button.setObjectName("flat")
        button.setText(text)
        button.clicked.connect(slot)
        return button

    def set_text(self, text: str) -> None:
        self.text = text
        doc = self.body.document()
        doc.setMarkdown(text or "…")
        cursor_block = doc.begin()
        background = code_background(self._scheme)
        while cursor_block.isValid():
            fmt = cursor_block.blockFormat()
            if fmt.nonBreakableLines() or fmt.hasProperty(QTextFormat.Property.BlockCodeFence):
                styled = QTextBlockFormat()
                styled.setBackground(background)
                QTextCursor(cursor_block).mergeBlockFormat(styled)
            cursor_block = cursor_block.next()
        self._fit()

    def set_footer(self, text: str) -> None:
        self.footer.setText(text)
        self.footer.setVisible(bool(text))

    def resizeEvent(self, event: QEvent) -> None:  # type: ignore[override]
        super().resizeEvent(event)  # type: ignore[arg-type]
        self._fit()

    def _fit(self) -> None:
        doc = self.body.document()
        doc.setTextWidth(max(50, self.body.viewport().width()))
        self.body.setFixedHeight(math.ceil(doc.size().height()) + 4)


class Composer(QPlainTextEdit):
    """Enter sends, Shift+Enter breaks the line, Up in an empty box edits the last message."""

    submitted = Signal()
    edit_last = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("composer")
        self.setPlaceholderText("Message (Enter to send, Shift+Enter for a new line)")
        self.setFixedHeight(84)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        if event.key() == Qt.Key.Key_Up and not self.toPlainText():
            self.edit_last.emit()
            return
        super().keyPressEvent(event)


class Banner(QFrame):
    """A one-line message above the conversation: an error, or startup progress."""

    def __init__(self, parent: QWidget | None = None, dismissable: bool = False) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.progress = QProgressBar()
        self.progress.setFixedWidth(160)
        self.progress.setTextVisible(False)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.progress)
        self.dismiss_button = QToolButton()
        self.dismiss_button.setObjectName("flat")
        self.dismiss_button.setText("Dismiss")
        self.dismiss_button.setVisible(dismissable)
        layout.addWidget(self.dismiss_button)
        self.hide()

    def show_message(
        self, text: str, *, error: bool, fraction: float | None = None, busy: bool = False
    ) -> None:
        if not text:
            self.hide()
            return
        self.setObjectName("banner_error" if error else "banner_info")
        # the label and the button too: their colours hang on the banner's name, and Qt
        # restyles only the widget repolished (the button stayed grey on the red)
        for widget in (self, self.label, self.dismiss_button):
            widget.style().unpolish(widget)
            widget.style().polish(widget)
        self.label.setText(text)
        self.progress.setVisible(busy or fraction is not None)
        self.progress.setRange(0, 0 if fraction is None else 100)
        if fraction is not None:
            self.progress.setValue(round(fraction * 100))
        self.show()


class ChatView(QWidget):
    send_requested = Signal(str)
    draft_edited = Signal(str)  # the message box's text, at each change
    stop_requested = Signal()
    regenerate_requested = Signal()
    edit_requested = Signal()
    copy_requested = Signal(str)

    def __init__(self, scheme: str = "light", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.scheme = scheme
        self.bubbles: list[MessageBubble] = []
        self._held = False
        self._stream: MessageBubble | None = None
        self._render = QTimer(self)
        self._render.setSingleShot(True)
        self._render.setInterval(40)  # re-render Markdown at most 25 times a second
        self._render.timeout.connect(self._render_stream)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        # Errors by origin ("chat", "connection", "models"), newest last: each stays on
        # screen until the user dismisses it or its own origin clears it (the connection
        # clears its own on reconnecting, never a failed reply's or a model's reason).
        self._errors: dict[str, str] = {}
        self.error_banner = Banner(dismissable=True)
        self.error_banner.dismiss_button.clicked.connect(self.dismiss_error)
        self.progress_banner = Banner()
        layout.addWidget(self.progress_banner)
        layout.addWidget(self.error_banner)
        self.scroll_area = QScrollArea()
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = QWidget()
        self.messages_layout = QVBoxLayout(inner)
        self.messages_layout.setSpacing(10)
        self.empty_label = QLabel("Start a conversation: type below and press Enter.")
        self.empty_label.setObjectName("muted")
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.messages_layout.addWidget(self.empty_label)
        self.messages_layout.addStretch(1)
        self.scroll_area.setWidget(inner)
        self.scroll_area.verticalScrollBar().rangeChanged.connect(self._follow)
        layout.addWidget(self.scroll_area, 1)

        row = QHBoxLayout()
        self.composer = Composer()
        self.composer.submitted.connect(self._submit)
        self.composer.edit_last.connect(self.edit_requested)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self._submit)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop_requested)
        self.stop_button.hide()
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        row.addWidget(self.composer, 1)
        row.addLayout(buttons)
        layout.addLayout(row)
        # how much of the draft the server has computed: quiet, under the message box
        self.draft_label = QLabel("")
        self.draft_label.setObjectName("muted")
        self.draft_label.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.draft_label.hide()
        layout.addWidget(self.draft_label)
        self.composer.textChanged.connect(
            lambda: self.draft_edited.emit(self.composer.toPlainText())
        )

    # -- messages ----------------------------------------------------------------------

    def set_messages(self, messages: list[StoredMessage]) -> None:
        for bubble in self.bubbles:
            self._drop(bubble)
        self.bubbles = []
        self._stream = None
        for msg in messages:
            self.add_message(msg)
        self._update_actions()

    def add_message(self, msg: StoredMessage) -> MessageBubble:
        bubble = self._add_bubble(msg.role)
        bubble.set_text(msg.content)
        if msg.report is not None:
            bubble.set_footer(format_status(msg.report))
        self._update_actions()
        return bubble

    def truncate(self, keep: int) -> None:
        for bubble in self.bubbles[keep:]:
            self._drop(bubble)
        del self.bubbles[keep:]
        self._update_actions()

    def start_reply(self) -> None:
        self._stream = self._add_bubble("assistant")
        self._stream.set_text("")
        self._update_actions()

    def append_delta(self, text: str) -> None:
        if self._stream is None:
            self.start_reply()
        assert self._stream is not None
        self._stream.text += text
        if not self._render.isActive():
            self._render.start()

    def finish_reply(self, msg: StoredMessage | None) -> None:
        self._render.stop()
        bubble, self._stream = self._stream, None
        if bubble is not None:
            if msg is None:
                self.bubbles.remove(bubble)
                self._drop(bubble)
            else:
                bubble.set_text(msg.content)
                if msg.report is not None:
                    bubble.set_footer(format_status(msg.report))
        self._update_actions()

    # -- state -------------------------------------------------------------------------

    def set_busy(self, busy: bool) -> None:
        self.stop_button.setVisible(busy)
        self.send_button.setEnabled(not busy and not self._held)
        self._update_actions(busy)

    def set_ready(self, text: str) -> None:
        """How much of the draft is ready ("" hides it)."""
        self.draft_label.setText(text)
        self.draft_label.setVisible(bool(text))

    def set_draft(self, text: str) -> None:
        self.composer.setPlainText(text)
        self.composer.moveCursor(QTextCursor.MoveOperation.End)
        self.composer.setFocus()

    def show_error(self, text: str, origin: str = "chat") -> None:
        """Shows ``text`` as ``origin``'s error; ``""`` clears that origin's error only."""
        self._errors.pop(origin, None)
        if text:
            self._errors[origin] = text
        self._show_latest_error()

    def dismiss_error(self) -> None:
        """The user closed the error shown; an older one, if any, shows again."""
        if self._errors:
            self._errors.pop(next(reversed(self._errors)))
        self._show_latest_error()

    def _show_latest_error(self) -> None:
        latest = next(reversed(self._errors.values()), "")
        self.error_banner.show_message(latest, error=True)

    def set_held(self, held: bool) -> None:
        """While held (a model loads) nothing can be sent; the draft stays."""
        self._held = held
        self.send_button.setEnabled(not held and self.stop_button.isHidden())

    def show_progress(self, text: str, fraction: float | None = None) -> None:
        self.progress_banner.show_message(text, error=False, fraction=fraction, busy=True)

    # -- internals ---------------------------------------------------------------------

    def _add_bubble(self, role: str) -> MessageBubble:
        bubble = MessageBubble(role, self.scheme)
        bubble.copy_clicked.connect(self.copy_requested)
        bubble.edit_clicked.connect(self.edit_requested)
        bubble.regenerate_clicked.connect(self.regenerate_requested)
        self.messages_layout.insertWidget(self.messages_layout.count() - 1, bubble)
        self.bubbles.append(bubble)
        self.empty_label.hide()
        return bubble

    def _drop(self, bubble: MessageBubble) -> None:
        # Out of the layout now: deleteLater alone leaves it on screen until the event
        # loop gets back to deferred deletes, which a nested processEvents never does.
        bubble.hide()
        self.messages_layout.removeWidget(bubble)
        bubble.deleteLater()

    def _update_actions(self, busy: bool | None = None) -> None:
        busy = self.stop_button.isVisible() if busy is None else busy
        self.empty_label.setVisible(not self.bubbles)
        last_user = max((i for i, b in enumerate(self.bubbles) if b.role == "user"), default=-1)
        for i, bubble in enumerate(self.bubbles):
            last = i == len(self.bubbles) - 1
            bubble.edit_button.setVisible(i == last_user and not busy)
            bubble.regenerate_button.setVisible(last and bubble.role == "assistant" and not busy)

    def _render_stream(self) -> None:
        if self._stream is not None:
            self._stream.set_text(self._stream.text)

    def _submit(self) -> None:
        text = self.composer.toPlainText().strip()
        if text and self.send_button.isEnabled():
            self.send_requested.emit(text)

    def _follow(self, _min: int, maximum: int) -> None:
        self.scroll_area.verticalScrollBar().setValue(maximum)
