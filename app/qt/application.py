"""The composition root: builds the store, the client, the controllers and the window,
and connects them. Nothing else knows all the parts.

The parts it composes live beside it: which server and how (server_setup), what the
window asks for (window_actions), what it says back (feedback), and the connections
between them (wiring). What stays here is the app's lifecycle, where the
conversations live, and the preferences."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings
from PySide6.QtGui import QCloseEvent

from ..core.history import History, ServerHistory, handed_over, to_hand_over
from ..core.launcher import is_loopback
from ..core.models import LocalModels
from ..core.preferences import Preferences
from ..core.private import private_dir_files, private_file
from ..core.secret_store import KeyringOrFile, SecretStore
from ..core.store import ConversationStore
from ..core.types import Backend
from .controllers import (
    ChatController,
    ConnectionController,
    DraftController,
    LibraryController,
    MemoryController,
    ModelController,
)
from .feedback import Feedback
from .models import ConversationListModel
from .server_setup import ServerSetup
from .views.main_window import MainWindow
from .views.settings_dialog import SettingsDialog
from .window_actions import WindowActions
from .wiring import wire
from .workers import Jobs

log = logging.getLogger(__name__)
LAST_KEY = "last_conversation"  # reopened at the next start (the server's list comes later)


@dataclass(frozen=True)
class Options:
    data_dir: Path
    base_url: str | None = None  # overrides the saved preference for this run
    api_key: str | None = None
    autostart: bool | None = None
    scheme: str = "light"


class WarmstartApp:
    def __init__(
        self,
        options: Options,
        backend: Backend | None = None,
        secrets: SecretStore | None = None,
    ) -> None:
        self.options = options
        private_dir_files(options.data_dir)
        self.secrets = secrets or KeyringOrFile(options.data_dir)
        # The app's own file: its preferences, and conversations only for a server that
        # keeps none. A warmstart server keeps them (self.server_history is the view).
        self.store = ConversationStore(options.data_dir / "conversations.db", self.secrets)
        self.server_history = ServerHistory(self.store, self.store)
        self.history: History = self.server_history  # until the server's kind is known
        self._shut_down = False
        self._history_of: Backend | None = None  # the server self.server_history lists
        prefs = Preferences.load(self.store, self.secrets)
        self.prefs = replace(
            prefs,
            base_url=options.base_url or prefs.base_url,
            api_key=options.api_key if options.api_key is not None else prefs.api_key,
            autostart=prefs.autostart if options.autostart is None else options.autostart,
        )
        self.server = ServerSetup(
            options.data_dir, lambda: self.prefs, lambda: self.connection.local
        )
        self.jobs = Jobs()
        self.connection = ConnectionController(
            self.jobs, backend or self.server.backend(), launcher=self.server.launcher()
        )
        private_file(self._settings_path(), create=True)
        self._build_controllers()
        self.window = MainWindow(options.scheme)
        self.window.conversations.setModel(self.conversations)
        self.window.closeEvent = self._on_close  # type: ignore[method-assign]
        self.actions = WindowActions(
            self.window, self.chat, self.models, self.library, self.conversations,
            lambda: self.history,
        )  # fmt: skip
        self.feedback = Feedback(
            self.window, self.connection, self.models, self.chat, self.conversations
        )
        wire(self)
        self._restore_geometry()

    # -- construction ------------------------------------------------------------------

    def _build_controllers(self) -> None:
        self.models = ModelController(
            self.connection,
            self.jobs,
            current=self.prefs.model,
            local=self._local_models,
            on_switched=self._remember_model,
        )
        self.chat = ChatController(
            self.history, self.connection, self.jobs, lambda: self.prefs,
            model=self.models.request_model,
        )  # fmt: skip
        self.drafts = DraftController(self.chat, self.connection, self.jobs, lambda: self.prefs)
        self.conversations = ConversationListModel()
        self.library = LibraryController(
            self.history, self.conversations, self.connection, self.jobs
        )
        self.memory = MemoryController(self.connection, self.jobs)

    @property
    def manages_local_server(self) -> bool:
        """The app runs its own server (and trusts no other) unless the user configured
        one (see ServerSetup)."""
        return self.server.manages_local_server

    def _local_models(self) -> LocalModels | None:
        """The models directory the models panel lists (see ServerSetup.local_models);
        a method of the app, so that a test can hand in its own."""
        return self.server.local_models()

    def _remember_model(self, name: str) -> None:
        """A switch worked: requests name it, and the local server starts with it."""
        self.prefs = replace(self.prefs, model=name)
        self.prefs.save(self.store, self.secrets)

    def _settings_path(self) -> Path:
        return self.options.data_dir / "window.ini"

    def _settings(self) -> QSettings:
        return QSettings(str(self._settings_path()), QSettings.Format.IniFormat)

    def _restore_geometry(self) -> None:
        settings = self._settings()
        geometry, state = settings.value("geometry"), settings.value("state")
        if geometry is not None:
            self.window.restoreGeometry(geometry)  # type: ignore[arg-type]
        if state is not None:
            self.window.restoreState(state)  # type: ignore[arg-type]

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Show the window at once; connecting (and maybe starting a server) follows."""
        self.window.show()
        self.window.connection_label.setText(Feedback.state_text(self.connection.state))
        first = self.history.conversations()
        if first:
            self.chat.open(first[0].id)
        else:
            self.chat.open(None)
        self.window.chat.composer.setFocus()
        self.connection.start()
        self.memory.start()

    def shutdown(self) -> None:
        if self.history is self.server_history and not self._shut_down:
            self.store.set_preference(LAST_KEY, self.chat.current)
        self._shut_down = True  # a second call (the window closing after) writes nothing
        settings = self._settings()
        settings.setValue("geometry", self.window.saveGeometry())
        settings.setValue("state", self.window.saveState())
        settings.sync()
        private_file(self._settings_path())
        self.memory.stop()
        self.chat.stop()
        self.models.shutdown()
        self.connection.shutdown()
        self.jobs.wait(5000)
        self.jobs.forget()
        self.store.close()

    def _on_close(self, event: QCloseEvent) -> None:
        self.shutdown()
        event.accept()

    # -- what the window and the connection ask of the app itself ------------------------

    def new_conversation(self) -> None:
        self.actions.new_conversation()

    def on_ready(self, health: object) -> None:
        """Connected: the window says so, and the recent conversations warm up."""
        self.feedback.ready(health)
        prewarm = self.prefs.overrides.get("prewarm_sessions")
        self.library.prewarm_recent(int(prewarm) if prewarm and prewarm.isdigit() else 3)

    # -- where conversations live ------------------------------------------------------

    def use_history(self, warmstart: bool) -> None:
        """A warmstart server keeps the conversations (the command line's and the API's
        too); a plain OpenAI-compatible server keeps none, so the app keeps its own."""
        backend, before = self.connection.backend, self._history_of
        self._history_of = backend
        if before is not None and before is not backend:
            self._fresh_server_history()  # another server (the settings changed)
        target: History = self.server_history if warmstart else self.store
        if target is not self.history:
            if not warmstart:
                self._keep_drafts_here()
            self.history = target
            self.chat.set_history(target)
            self.library.set_history(target)
            first = target.conversations()
            if not warmstart and first and self._untouched():
                self.chat.open(first[0].id)  # the app's own list is here at once
            self.actions.select(self.chat.current)
        if warmstart and is_loopback(self.connection.backend.base_url):
            self._hand_over()

    def _fresh_server_history(self) -> None:
        """The new server's list, not the last one's."""
        old, self.server_history = self.server_history, ServerHistory(self.store, self.store)
        if self.history is old:
            self.history = self.server_history
            self.chat.set_history(self.server_history)
            self.library.set_history(self.server_history)

    def _keep_drafts_here(self) -> None:
        """Conversations begun before the server answered move to the app's own file."""
        for conv in self.server_history.conversations():
            messages = self.server_history.messages(conv.id)
            if self.server_history.is_draft(conv.id) and self.store.get(conv.id) is None:
                self.store.create(conv.title, model=conv.model, cid=conv.id)
                for m in messages:
                    self.store.append(conv.id, m.role, m.content, m.report)

    def _hand_over(self) -> None:
        """The conversations in the app's own file move to the server on this machine,
        once: each leaves the file when the server has it (see history.handed_over)."""
        kept = to_hand_over(self.store)
        if not kept and not self.store.conversations():
            return
        backend = self.connection.backend

        def done(result: dict[str, Any] | None) -> None:
            held = handed_over(self.store, self.server_history, result)
            log.info("handed %d conversations over to the server", held)
            self.library.reload()  # their pins
            self.memory.refresh()

        self.jobs.submit(
            lambda: backend.import_sessions(kept) if kept else {},
            done,
            lambda exc: log.warning("conversations stay in the app's file for now: %s", exc),
        )

    def on_synced(self, suspects: set[str]) -> None:
        """After a listing from the server: reread what changed, resume the
        conversation open when the app last closed, reselect."""
        self.chat.check_changed(suspects)
        self._resume_last()
        self.actions.select(self.chat.current)

    def _resume_last(self) -> None:
        """The server's list comes after the window: the last conversation is opened
        then, unless the user has begun something (a new one, or typing) meanwhile."""
        last = self.store.preference(LAST_KEY)
        if last is None:
            return
        self.store.set_preference(LAST_KEY, None)  # once: later it is the user's choice
        if self._untouched() and self.history.get(last) is not None:
            self.chat.open(last)

    def _untouched(self) -> bool:
        """No conversation open, none on its way, nothing typed."""
        return (
            self.chat.current is None
            and not self.chat.busy
            and not self.window.chat.composer.toPlainText().strip()
        )

    # -- preferences -------------------------------------------------------------------

    def open_settings(self) -> None:
        dialog = SettingsDialog(self.prefs, self.window)
        backend = self.connection.backend
        self.jobs.submit(
            backend.server_settings,
            dialog.set_server_settings,
            lambda e: dialog.thresholds_note.setText(f"Could not ask the server: {e}"),
        )
        if dialog.exec():
            self.apply_preferences(dialog.preferences())

    def apply_preferences(self, prefs: Preferences) -> None:
        server_changed = (prefs.base_url, prefs.api_key, prefs.autostart) != (
            self.prefs.base_url,
            self.prefs.api_key,
            self.prefs.autostart,
        )
        self.prefs = prefs
        prefs.save(self.store, self.secrets)
        if server_changed:
            self.connection.set_backend(self.server.backend(), self.server.launcher())
            self.window.models.set_can_download(self.models.can_download)
