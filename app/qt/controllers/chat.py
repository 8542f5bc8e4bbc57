"""One conversation at a time: sending, streaming the reply, stop, regenerate, edit."""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from ...core.errors import describe
from ...core.history import History, ServerHistory
from ...core.preferences import Preferences
from ...core.report import ReplyReport, format_status
from ...core.store import DEFAULT_TITLE, StoredMessage
from ...core.types import Backend, SessionSummary
from ..workers import Jobs, StreamRunner
from .connection import ConnectionController

log = logging.getLogger(__name__)


def title_from(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else DEFAULT_TITLE
    return first if len(first) <= 48 else first[:47].rstrip() + "…"


class ChatController(QObject):
    opened = Signal(str, list)  # conversation id, its messages
    message_added = Signal(object)  # StoredMessage
    truncated = Signal(int)  # keep this many messages of the open conversation
    reply_started = Signal()
    reply_delta = Signal(str)
    reply_finished = Signal(object)  # the assistant's StoredMessage, or None when empty
    busy_changed = Signal(bool)
    status = Signal(str)
    error = Signal(str)  # "" clears
    report_received = Signal(str, object)  # conversation id, ReplyReport
    conversations_changed = Signal()

    def __init__(
        self,
        store: History,
        connection: ConnectionController,
        jobs: Jobs,
        preferences: Callable[[], Preferences],
        parent: QObject | None = None,
        *,
        model: Callable[[], str | None] | None = None,
    ) -> None:
        """``model``: the model requests name (the picker's, once the server has it);
        by default the preferences' own."""
        super().__init__(parent)
        self._store = store  # swapped by set_history when the server's kind is known
        self._connection = connection
        self._jobs = jobs
        self._prefs = preferences
        self._model = model or (lambda: self._prefs().model or None)
        self.current: str | None = None
        self._runner: StreamRunner | None = None
        self._streaming_cid: str | None = None
        self._partial: list[str] = []
        self._pending: str | None = None  # a conversation waiting for the server
        self._editing: int | None = None  # position of the user message being edited
        self._loading: str | None = None  # a conversation whose messages are on their way
        connection.became_ready.connect(self._resume_pending)

    @property
    def busy(self) -> bool:
        return self._runner is not None or self._pending is not None

    def partial_text(self) -> str:
        return "".join(self._partial)

    # -- conversations ---------------------------------------------------------------

    def new_conversation(self) -> str:
        conv = self._store.create(model=self._prefs().model or None)
        self.conversations_changed.emit()
        self.open(conv.id)
        return conv.id

    def set_history(self, history: History) -> None:
        """Conversations now live in ``history`` (the server's, or the app's own)."""
        if history is self._store:
            return
        self._store = history
        self._loading = None
        keep = self.current if self.current and history.get(self.current) else None
        if keep is None and self._pending is not None:
            self.stop()  # its conversation is not in the new history
        self.open(keep)

    def open(self, cid: str | None) -> None:
        self._editing = None
        self.current = cid
        history = self._store
        if cid and isinstance(history, ServerHistory) and not history.loaded(cid):
            self._load(cid)
        self.opened.emit(cid or "", self._store.messages(cid) if cid else [])
        if cid and cid == self._streaming_cid:
            self.reply_started.emit()
            if self._partial:
                self.reply_delta.emit(self.partial_text())

    def messages(self) -> list[StoredMessage]:
        return self._store.messages(self.current) if self.current else []

    # -- the server's copy ---------------------------------------------------------------

    def _load(self, cid: str) -> None:
        """Reads a conversation's messages from the server; it opens empty until then."""
        self._loading = cid
        self.status.emit("Loading the conversation…")
        backend = self._connection.backend
        self._jobs.submit(
            lambda: backend.session(cid),
            lambda session: self._on_loaded(cid, session),
            lambda exc: self._on_load_failed(cid, exc),
        )

    def _unread(self) -> bool:
        """True while the open conversation's messages are not here yet (read again if
        the last try failed): a turn sent now would overwrite the server's copy with a
        partial one."""
        history, cid = self._store, self.current
        if cid is None or not isinstance(history, ServerHistory) or history.loaded(cid):
            return False
        if self._loading != cid:
            self._load(cid)
        self.status.emit("Still loading this conversation from the server…")
        return True

    def _on_loaded(self, cid: str, session: SessionSummary | None) -> None:
        history = self._store
        if self._loading != cid or not isinstance(history, ServerHistory):
            return
        self._loading = None
        if session is None:
            self.status.emit("The server no longer has this conversation.")
            return
        messages = history.set_messages(cid, session)
        self.status.emit("")
        if cid == self.current:
            self.opened.emit(cid, messages)

    def _on_load_failed(self, cid: str, exc: BaseException) -> None:
        if self._loading == cid:
            self._loading = None
            self.error.emit(describe(exc))
            self._connection.report_error(exc)

    def check_changed(self, suspects: set[str]) -> None:
        """The server saved these opened conversations again (our own reply, or another
        client going on with one): each is read again, and the open one shown anew if
        it differs. What is here stays meanwhile (mostly it is the same)."""
        history = self._store
        if not isinstance(history, ServerHistory):
            return
        backend = self._connection.backend
        for cid in suspects:
            self._reread(backend, cid)

    def _reread(self, backend: Backend, cid: str) -> None:
        self._jobs.submit(
            lambda: backend.session(cid),
            lambda session: self._on_refreshed(cid, session),
            lambda exc: log.info("could not read conversation %s again: %s", cid, exc),
        )

    def _on_refreshed(self, cid: str, session: SessionSummary | None) -> None:
        history = self._store
        if session is None or not isinstance(history, ServerHistory):
            return
        # a turn of ours on its way (the server's copy is about to change), or an edit
        # under way: left as it is, and compared again at the next listing
        if cid in (self._streaming_cid, self._pending) or (
            cid == self.current and self._editing is not None
        ):
            return
        if history.refresh(cid, session) and cid == self.current:
            self.opened.emit(cid, history.messages(cid))

    # -- sending -----------------------------------------------------------------------

    def send(self, text: str) -> bool:
        """Add the user's message and ask for a reply; False when it cannot be sent now."""
        text = text.strip()
        if not text or self.busy:
            return False
        if self._unread():
            return False
        cid = self.current or self.new_conversation()
        conv = self._store.get(cid)
        if self._editing is not None:
            self._store.truncate(cid, self._editing)
            self.truncated.emit(self._editing)
            self._editing = None
        if conv and conv.title == DEFAULT_TITLE and not self._store.messages(cid):
            self._store.rename(cid, title_from(text))
        self.message_added.emit(self._store.append(cid, "user", text))
        self.conversations_changed.emit()
        self._request(cid)
        return True

    def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
        elif self._pending is not None:
            self._pending = None
            self.busy_changed.emit(False)
            self.status.emit("Cancelled before the server was ready.")

    def regenerate(self) -> bool:
        msgs = self.messages()
        if self.busy or not msgs or self.current is None:
            return False
        if self._unread():
            return False
        if msgs[-1].role == "assistant":
            self._store.truncate(self.current, msgs[-1].position)
            self.truncated.emit(msgs[-1].position)
        if not any(m.role == "user" for m in msgs):
            return False
        self._request(self.current)
        return True

    def edit_last(self) -> str | None:
        """Start editing the last user message: returns its text; the next ``send``
        replaces it and everything after it."""
        last_user = next((m for m in reversed(self.messages()) if m.role == "user"), None)
        if last_user is None or self.busy:
            return None
        self._editing = last_user.position
        return last_user.content

    @property
    def editing(self) -> bool:
        return self._editing is not None

    def api_messages(self, cid: str) -> list[dict[str, str]]:
        """The conversation as a request sends it (the system prompt first)."""
        history = [m.as_api() for m in self._store.messages(cid)]
        system = self._prefs().system_prompt
        return [{"role": "system", "content": system}, *history] if system else history

    def model(self) -> str | None:
        """The model requests name."""
        return self._model()

    def last_reply(self) -> str:
        return next((m.content for m in reversed(self.messages()) if m.role == "assistant"), "")

    # -- the stream --------------------------------------------------------------------

    def _request(self, cid: str) -> None:
        self.error.emit("")
        if not self._connection.ready:
            self._pending = cid
            self.busy_changed.emit(True)
            self.status.emit("Waiting for the server; the message goes out when it is ready…")
            return
        prefs = self._prefs()
        stream = self._connection.backend.chat(
            self.api_messages(cid), session_id=cid, model=self._model(), sampling=prefs.sampling
        )
        if isinstance(self._store, ServerHistory):
            self._store.hold(cid)
        runner = StreamRunner(stream, self._jobs.pool, self)
        runner.delta.connect(self._on_delta)
        runner.finished.connect(lambda report: self._on_finished(cid, report))
        runner.failed.connect(lambda exc: self._on_failed(cid, exc))
        self._runner, self._streaming_cid, self._partial = runner, cid, []
        self.busy_changed.emit(True)
        if cid == self.current:
            self.reply_started.emit()
        self.status.emit("Generating…")
        runner.start()

    def _resume_pending(self) -> None:
        cid, self._pending = self._pending, None
        if cid is not None:
            self._request(cid)

    def _on_delta(self, text: str) -> None:
        self._partial.append(text)
        if self._streaming_cid == self.current:
            self.reply_delta.emit(text)

    def _end_stream(self) -> str:
        text = self.partial_text()
        self._runner, self._streaming_cid, self._partial = None, None, []
        self.busy_changed.emit(False)
        return text

    def _on_finished(self, cid: str, report: ReplyReport) -> None:
        text = self._end_stream()
        msg = self._store.append(cid, "assistant", text, report) if text else None
        self._release(cid)
        if cid == self.current:
            self.reply_finished.emit(msg)
        self.status.emit(format_status(report))
        self.report_received.emit(cid, report)
        self.conversations_changed.emit()

    def _on_failed(self, cid: str, exc: BaseException) -> None:
        text = self._end_stream()
        log.info("reply failed: %s", exc)
        # Keep what already arrived: the user can regenerate, or read what was there.
        msg = self._store.append(cid, "assistant", text) if text else None
        self._release(cid)
        if cid == self.current:
            self.reply_finished.emit(msg)
        # The connection first: a lost server turns it "down" before the reason shows,
        # so the window can tell that reason is the connection's (cleared on its return).
        self._connection.report_error(exc)
        self.error.emit(describe(exc))
        self.status.emit("The reply failed.")

    def _release(self, cid: str) -> None:
        if isinstance(self._store, ServerHistory):
            self._store.release(cid)
