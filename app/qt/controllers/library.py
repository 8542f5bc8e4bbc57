"""The conversation list: search, rename, pin, delete, and prewarming recent ones.

Against a warmstart server the list is the server's, refreshed from each sessions poll
(``apply_sessions``): conversations made by the command line or the API appear in it,
and renames and deletions go to the server."""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal

from ...core.history import History, ServerHistory
from ...core.types import SessionSummary
from ..models import ConversationListModel
from ..workers import Jobs
from .connection import ConnectionController

log = logging.getLogger(__name__)


class LibraryController(QObject):
    prewarm_progress = Signal(int, int)  # done, total; total 0 = nothing to do
    deleted = Signal(str)
    # after a server listing: the opened conversations it saved again (ChatController)
    synced = Signal(object)

    def __init__(
        self,
        store: History,
        model: ConversationListModel,
        connection: ConnectionController,
        jobs: Jobs,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._store = store
        self.model = model
        self._connection = connection
        self._jobs = jobs
        self.search_text = ""
        self._prewarm_wanted: int | None = None  # asked before the server's list came
        self.reload()

    def set_history(self, history: History) -> None:
        self._store = history
        self.reload()

    def reload(self) -> None:
        self.model.set_conversations(self._store.conversations(self.search_text))

    def set_search(self, text: str) -> None:
        self.search_text = text
        self.reload()
        history = self._store
        if isinstance(history, ServerHistory) and text.strip():
            # the text of conversations not opened here is on the server: ask it
            backend = self._connection.backend
            self._jobs.submit(
                lambda: backend.sessions(text.strip()),
                lambda found: self._on_found(text, found),
                lambda exc: log.info("the server could not search: %s", exc),
            )

    def _on_found(self, text: str, found: list[SessionSummary] | None) -> None:
        history = self._store
        if isinstance(history, ServerHistory) and found is not None:
            history.set_found(text, found)
            if text == self.search_text:
                self.reload()

    def rename(self, cid: str, title: str) -> None:
        if title.strip():
            self._store.rename(cid, title)
            self.reload()
            history = self._store
            if isinstance(history, ServerHistory):
                if history.is_draft(cid):
                    history.title_later(cid, title)
                else:
                    self._send_title(cid, title.strip())

    def _send_title(self, cid: str, title: str) -> None:
        backend = self._connection.backend
        self._jobs.submit(
            lambda: backend.rename_session(cid, title),
            on_error=lambda exc: log.warning("the server kept the old title: %s", exc),
        )

    def set_pinned(self, cid: str, pinned: bool) -> None:
        self._store.set_pinned(cid, pinned)
        self.reload()

    def toggle_pinned(self, cid: str) -> None:
        conv = self._store.get(cid)
        if conv:
            self.set_pinned(cid, not conv.pinned)

    def delete(self, cid: str) -> None:
        """Forget the conversation here and its KV on the server (best effort: a server
        that is down or does not know it changes nothing for the user)."""
        self._store.delete(cid)
        self.reload()
        self.deleted.emit(cid)
        backend = self._connection.backend
        self._jobs.submit(
            lambda: backend.delete_session(cid),
            on_error=lambda exc: log.info("server kept session %s: %s", cid, exc),
        )

    def apply_sessions(self, sessions: list[SessionSummary] | None) -> None:
        self.model.set_sessions(sessions)
        history = self._store
        if sessions is None or not isinstance(history, ServerHistory):
            return
        changed, suspects = history.apply_list(sessions)
        for cid, title in history.titles_due().items():
            self._send_title(cid, title)
        if changed:
            self.reload()
        self.synced.emit(suspects)
        if self._prewarm_wanted is not None:
            count, self._prewarm_wanted = self._prewarm_wanted, None
            self.prewarm_recent(count)

    def prewarm_recent(self, count: int) -> None:
        """Ask the server to bring the ``count`` most recent conversations up to RAM, one
        after the other, so the first question in each is answered from cache."""
        history = self._store
        if isinstance(history, ServerHistory) and not history.synced:
            self._prewarm_wanted = count  # once the server's list is here
            return
        ids = [c.id for c in self._store.conversations()[:count]]
        self.prewarm_progress.emit(0, len(ids))
        if not ids:
            return
        backend = self._connection.backend
        state = {"done": 0}

        def step(_result: object = None) -> None:
            if state["done"] >= len(ids):
                return
            cid = ids[state["done"]]
            state["done"] += 1

            def after(_r: object = None) -> None:
                self.prewarm_progress.emit(state["done"], len(ids))
                step()

            self._jobs.submit(lambda: backend.prewarm(cid), after, after)

        step()
