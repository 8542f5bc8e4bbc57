"""Warm before Enter: the open conversation's draft goes to the server while the user
types (``POST /v1/warmstart/prefill``), so a pasted text is computed while the
question is written, and opening a conversation brings it back into a live sequence.

Sent after a pause in typing (DEBOUNCE_MS), at once after BURST_CHARS new characters
(a paste), and never while a reply is on its way. The server supersedes an older
draft of the same conversation, so a newer one goes out at once; only the newest
answer is shown. Off by the ``drafts`` preference, and by default on battery.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from ...core.preferences import Preferences
from ..workers import Jobs
from .chat import ChatController
from .connection import ConnectionController

log = logging.getLogger(__name__)

DEBOUNCE_MS = 400
BURST_CHARS = 300


def on_battery() -> bool:
    """True when the machine runs on its battery (psutil; False where unknown)."""
    try:
        import psutil

        battery = psutil.sensors_battery()
    except Exception:  # no sensor API on this platform: treated as plugged in
        return False
    return battery is not None and not battery.power_plugged


def drafts_on(prefs: Preferences, battery: Callable[[], bool] = on_battery) -> bool:
    """The ``drafts`` preference: "on", "off", or "auto" (on unless on battery)."""
    return prefs.drafts == "on" or (prefs.drafts == "auto" and not battery())


class DraftController(QObject):
    ready = Signal(str)  # "3,120 of 3,150 tokens ready"; "" clears

    def __init__(
        self,
        chat: ChatController,
        connection: ConnectionController,
        jobs: Jobs,
        preferences: Callable[[], Preferences],
        parent: QObject | None = None,
        *,
        battery: Callable[[], bool] = on_battery,
    ) -> None:
        super().__init__(parent)
        self._chat, self._connection, self._jobs = chat, connection, jobs
        self._prefs, self._battery = preferences, battery
        self._text = ""
        self._sent_chars = 0  # the length of the text last sent
        self._ids = itertools.count(1)
        self._latest = 0  # the newest draft sent: older answers are not shown
        self._heard = 0  # the newest draft answered
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(DEBOUNCE_MS)
        self._timer.timeout.connect(self._send)
        chat.reply_started.connect(self._cancel)
        chat.opened.connect(lambda cid, _m: self._opened(cid))

    @property
    def pending(self) -> bool:
        """A draft is waiting to go out, or for its answer."""
        return self._timer.isActive() or self._heard < self._latest

    @property
    def enabled(self) -> bool:
        return drafts_on(self._prefs(), self._battery)

    def edited(self, text: str) -> None:
        """The message box changed: its text is sent after a pause, or at once after a
        paste (or a few hundred new characters)."""
        self._text = text
        if not text.strip():
            self._timer.stop()
            self._sent_chars = 0
            self.ready.emit("")
            return
        if not self.enabled:
            return
        if abs(len(text) - self._sent_chars) >= BURST_CHARS:
            self._send()
        else:
            self._timer.start()

    def _opened(self, cid: str) -> None:
        """A conversation was opened: it is brought into a live sequence (its next
        message then finds its whole history live), unless a draft is being typed."""
        self._timer.stop()
        self.ready.emit("")
        if cid and self.enabled and not self._text.strip() and self._chat.messages():
            self._post(cid, self._chat.api_messages(cid), quiet=True)

    def _cancel(self) -> None:
        """A reply is on its way: its request ended the draft; nothing more is shown."""
        self._timer.stop()
        self._latest = self._heard = next(self._ids)
        self._text, self._sent_chars = "", 0
        self.ready.emit("")

    def _send(self) -> None:
        if self._chat.busy or not self._text.strip():
            return
        # a first message being typed: its conversation begins now, so that the
        # server's draft and the request after Enter name the same one
        cid = self._chat.current or self._chat.new_conversation()
        self._sent_chars = len(self._text)
        draft = [*self._chat.api_messages(cid), {"role": "user", "content": self._text}]
        self._post(cid, draft)

    def _post(self, cid: str, messages: list[dict[str, str]], quiet: bool = False) -> None:
        if not self._connection.ready:
            return
        number = self._latest = next(self._ids)
        backend, model = self._connection.backend, self._chat.model()
        self._jobs.submit(
            lambda: backend.prefill(messages, session_id=cid, model=model),
            lambda answer: self._answered(number, answer, quiet),
            lambda exc: self._failed(number, exc),
        )

    def _failed(self, number: int, exc: BaseException) -> None:
        self._heard = max(self._heard, number)
        log.info("a draft was not taken: %s", exc)

    def _answered(self, number: int, answer: dict[str, Any] | None, quiet: bool) -> None:
        self._heard = max(self._heard, number)
        if number != self._latest or answer is None or quiet:
            return
        ready, total = int(answer.get("ready_tokens", 0)), int(answer.get("prompt_tokens", 0))
        if total:
            self.ready.emit(f"{ready:,} of {total:,} tokens ready")
