"""The composition root: builds the store, the client, the controllers and the window,
and connects them. Nothing else knows all the parts."""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QItemSelectionModel, QModelIndex, QSettings
from PySide6.QtGui import QCloseEvent, QGuiApplication
from PySide6.QtWidgets import QInputDialog, QMessageBox

from ..core.api import ApiClient
from ..core.errors import AppError, UntrustedServer
from ..core.history import History, ServerHistory, handed_over, to_hand_over
from ..core.launcher import (
    KEY_FILE,
    LocalServer,
    is_loopback,
    new_key,
    override_env,
    port_of,
    serve_command,
    socket_path_for,
)
from ..core.models import LocalModels
from ..core.preferences import Preferences
from ..core.private import private_dir_files, private_file
from ..core.report import TIER_LABELS
from ..core.secret_store import KeyringOrFile, SecretStore
from ..core.store import Conversation, ConversationStore
from ..core.types import Backend
from .controllers import (
    ChatController,
    ConnectionController,
    LibraryController,
    MemoryController,
    ModelController,
)
from .models import ConversationListModel, Roles
from .views.main_window import MainWindow
from .views.settings_dialog import SettingsDialog
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
        self._server_model = ""  # the model the server said it had loaded, at connecting
        self._history_of: Backend | None = None  # the server self.server_history lists
        prefs = Preferences.load(self.store, self.secrets)
        # The local server's key: fresh for each run, given to no other server.
        self._server_key = new_key()
        # ...and the socket it is reached through (chosen when first needed)
        self._socket: tuple[Path | None] | None = None
        self.prefs = replace(
            prefs,
            base_url=options.base_url or prefs.base_url,
            api_key=options.api_key if options.api_key is not None else prefs.api_key,
            autostart=prefs.autostart if options.autostart is None else options.autostart,
        )
        self.jobs = Jobs()
        self.connection = ConnectionController(
            self.jobs, backend or self._make_backend(), launcher=self._launcher()
        )
        private_file(self._settings_path(), create=True)
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
        self.conversations = ConversationListModel()
        self.library = LibraryController(
            self.history, self.conversations, self.connection, self.jobs
        )
        self.memory = MemoryController(self.connection, self.jobs)
        self.window = MainWindow(options.scheme)
        self.window.conversations.setModel(self.conversations)
        self.window.closeEvent = self._on_close  # type: ignore[method-assign]
        self._wire()
        self._restore_geometry()

    # -- construction ------------------------------------------------------------------

    @property
    def manages_local_server(self) -> bool:
        """The app runs its own server (and trusts no other) unless the user configured
        one: a key, a URL off this machine, or "start a local server" off."""
        prefs = self.prefs
        return prefs.autostart and is_loopback(prefs.base_url) and not prefs.api_key

    def _make_backend(self) -> ApiClient:
        if self.manages_local_server:
            return ApiClient(
                self.prefs.base_url,
                api_key=self._server_key,
                verify=True,
                before_key=self._check_own_server,
                uds=str(self._socket_path) if self._socket_path else None,
            )
        return ApiClient(self.prefs.base_url, api_key=self.prefs.api_key or None)

    @property
    def _socket_path(self) -> Path | None:
        """Where the app's own server listens besides its port (None: nowhere else,
        as on Windows)."""
        if self._socket is None:
            self._socket = (socket_path_for(self.options.data_dir),)
        return self._socket[0]

    def _check_own_server(self) -> None:
        """Before the key goes out: is it our server that listens on the port?"""
        local = self.connection.local
        if local is None:
            raise UntrustedServer(
                self.prefs.base_url,
                "the app did not start it, and uses no server on this machine that it did "
                "not start unless you configure one",
            )
        local.check_listening(port_of(self.prefs.base_url))

    def _launcher(self) -> Callable[[], LocalServer] | None:
        if not self.manages_local_server:
            return None
        override = os.environ.get("WARMSTART_APP_SERVER_CMD")
        data = self.options.data_dir

        def make() -> LocalServer:
            command = serve_command(
                port_of(self.prefs.base_url), shlex.split(override) if override else None
            )
            env = override_env(self.prefs.overrides)
            if self.prefs.model:
                env["WARMSTART_MODEL"] = self.prefs.model
            return LocalServer(
                command,
                data / "server.log",
                env,
                api_key=self._server_key,
                key_path=data / KEY_FILE,
                socket_path=self._socket_path,
            )

        return make

    def _local_models(self) -> LocalModels | None:
        """The models directory of the server the app starts; None for any other server
        (its models live on its own machine)."""
        if not self.manages_local_server:
            return None
        try:
            return LocalModels.for_local_server(self.prefs.overrides)
        except AppError as exc:
            log.warning("no local models: %s", exc)
            return None

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

    def _wire(self) -> None:
        w, chat, conn = self.window, self.chat, self.connection
        view = w.chat
        # chat view <-> chat controller
        view.send_requested.connect(self._send)
        view.stop_requested.connect(chat.stop)
        view.regenerate_requested.connect(chat.regenerate)
        view.edit_requested.connect(self._edit_last)
        view.copy_requested.connect(lambda text: QGuiApplication.clipboard().setText(text))
        chat.opened.connect(lambda _cid, msgs: view.set_messages(msgs))
        chat.opened.connect(lambda cid, _m: self._select(cid))
        chat.opened.connect(lambda _c, _m: self._show_location())
        chat.message_added.connect(view.add_message)
        chat.truncated.connect(view.truncate)
        chat.reply_started.connect(view.start_reply)
        chat.reply_delta.connect(view.append_delta)
        chat.reply_finished.connect(view.finish_reply)
        chat.busy_changed.connect(view.set_busy)
        chat.status.connect(w.status_label.setText)
        chat.error.connect(self._on_chat_error)
        chat.conversations_changed.connect(self.library.reload)
        chat.conversations_changed.connect(lambda: self._select(chat.current))
        chat.report_received.connect(self.memory.add_report)
        chat.opened.connect(
            lambda cid, msgs: self.memory.recall(cid, [m.report for m in msgs if m.report])
        )
        # list
        w.conversations.clicked.connect(self._open_index)
        w.conversations.activated.connect(self._open_index)
        w.search.textChanged.connect(self.library.set_search)
        w.search.textChanged.connect(lambda _t: self._select(chat.current))
        self.library.deleted.connect(self._on_deleted)
        self.library.synced.connect(self._on_synced)
        self.library.prewarm_progress.connect(self._on_prewarm)
        # memory
        self.memory.snapshot.connect(w.memory.set_snapshot)
        self.memory.sessions.connect(self.library.apply_sessions)
        self.memory.sessions.connect(lambda _s: self._show_location())
        self.memory.history_changed.connect(w.memory.set_history)
        self.memory.last_report.connect(w.memory.set_last_report)
        # connection
        conn.message.connect(self._on_connection_message)
        conn.progress.connect(self._on_progress)
        conn.state_changed.connect(lambda s: w.connection_label.setText(self._state_text(s)))
        conn.became_ready.connect(self._on_ready)
        conn.capabilities.connect(lambda ok: None if ok else w.memory.set_snapshot(None))
        # models
        picker, models = w.models, self.models
        picker.use_requested.connect(models.use)
        picker.download_requested.connect(models.download)
        picker.cancel_requested.connect(models.cancel_download)
        models.listed.connect(picker.set_models)
        models.current_changed.connect(picker.set_current)
        models.current_changed.connect(lambda _name: self._show_connected())
        models.loading_changed.connect(self._on_model_loading)
        models.download_progress.connect(picker.set_download)
        models.error.connect(lambda text: view.show_error(text, "models"))
        models.status.connect(w.status_label.setText)
        picker.set_current(models.current)
        picker.set_can_download(models.can_download)
        conn.capabilities.connect(self._use_history)
        # actions
        w.new_button.clicked.connect(self.new_conversation)
        w.new_action.triggered.connect(self.new_conversation)
        w.search_action.triggered.connect(self._focus_search)
        w.settings_action.triggered.connect(self.open_settings)
        w.quit_action.triggered.connect(w.close)
        w.stop_action.triggered.connect(chat.stop)
        w.regenerate_action.triggered.connect(chat.regenerate)
        w.edit_action.triggered.connect(self._edit_last)
        w.copy_action.triggered.connect(
            lambda: QGuiApplication.clipboard().setText(chat.last_reply())
        )
        w.rename_action.triggered.connect(self._rename_selected)
        w.pin_action.triggered.connect(self._pin_selected)
        w.delete_action.triggered.connect(self._delete_selected)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Show the window at once; connecting (and maybe starting a server) follows."""
        self.window.show()
        self.window.connection_label.setText(self._state_text(self.connection.state))
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

    # -- behaviour the window asks for ----------------------------------------------------

    def new_conversation(self) -> None:
        self.window.search.clear()
        self.chat.new_conversation()
        self.window.chat.composer.setFocus()

    def _focus_search(self) -> None:
        self.window.search.setFocus()
        self.window.search.selectAll()

    def _send(self, text: str) -> None:
        if self.models.loading:  # the reply would come from the model being replaced
            return
        if self.chat.send(text):
            self.window.chat.composer.clear()

    def _edit_last(self) -> None:
        text = self.chat.edit_last()
        if text is not None:
            self.window.chat.set_draft(text)
            self.window.status_label.setText("Editing the last message: Enter resends it.")

    def _open_index(self, index: QModelIndex) -> None:
        cid = self.conversations.data(index, Roles.Id)
        if cid and cid != self.chat.current:
            self.chat.open(cid)

    def _select(self, cid: str | None) -> None:
        view = self.window.conversations
        row = self.conversations.row_of(cid) if cid else -1
        flag = QItemSelectionModel.SelectionFlag.ClearAndSelect
        if row >= 0:
            view.selectionModel().setCurrentIndex(self.conversations.index(row), flag)
        else:
            view.clearSelection()

    def _selected_id(self) -> str | None:
        return self.chat.current

    def _selected_conversation(self) -> Conversation | None:
        cid = self._selected_id()
        return self.history.get(cid) if cid else None

    def _rename_selected(self) -> None:
        conv = self._selected_conversation()
        if conv is None:
            return
        title, ok = QInputDialog.getText(self.window, "Rename", "Title", text=conv.title)
        if ok:
            self.library.rename(conv.id, title)
            self._select(conv.id)

    def _pin_selected(self) -> None:
        cid = self._selected_id()
        if cid:
            self.library.toggle_pinned(cid)
            self._select(cid)

    def _delete_selected(self) -> None:
        conv = self._selected_conversation()
        if conv is None:
            return
        answer = QMessageBox.question(
            self.window, "Delete conversation", f"Delete “{conv.title}” and its cached context?"
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.library.delete(conv.id)

    def _on_deleted(self, cid: str) -> None:
        if cid == self.chat.current:
            rest = self.history.conversations()
            self.chat.open(rest[0].id if rest else None)

    # -- where conversations live ------------------------------------------------------

    def _use_history(self, warmstart: bool) -> None:
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
            self._select(self.chat.current)
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

    def _on_synced(self, suspects: set[str]) -> None:
        """After a listing from the server: reread what changed, resume the
        conversation open when the app last closed, reselect."""
        self.chat.check_changed(suspects)
        self._resume_last()
        self._select(self.chat.current)

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
            self.connection.set_backend(self._make_backend(), self._launcher())
            self.window.models.set_can_download(self.models.can_download)

    # -- feedback ----------------------------------------------------------------------

    @staticmethod
    def _state_text(state: str) -> str:
        return {
            "connecting": "● connecting",
            "starting": "● starting the server",
            "ready": "● connected",
            "down": "● server down",
        }.get(state, state)

    def _on_chat_error(self, text: str) -> None:
        # A reply lost with the server is the connection's reason, gone when it is back;
        # any other stays until the user dismisses it or sends again.
        lost = bool(text) and self.connection.state == "down"
        self.window.chat.show_error(text, "connection" if lost else "chat")

    def _on_connection_message(self, text: str) -> None:
        # The connection clears only its own reason: a failed reply's or a model's
        # stays until the user dismisses it (the 3-second health poll used to wipe it).
        if self.connection.state == "down":
            self.window.chat.show_error(text, "connection")
        elif self.connection.state == "ready":
            self.window.chat.show_error("", "connection")
        else:
            self.window.chat.show_progress(text)

    def _on_progress(self, text: str, fraction: object) -> None:
        frac = float(fraction) if isinstance(fraction, int | float) else None
        if text:
            self.window.chat.show_progress(text, frac)
        else:
            self.window.chat.show_progress("")

    def _on_ready(self, health: object) -> None:
        model = getattr(health, "model", None)
        self._server_model = str(model) if model else ""
        self._show_connected()
        self.window.chat.show_error("", "connection")
        self.window.chat.show_progress("")
        if self.models.loading:
            self._on_model_loading(self.models.loading)
        prewarm = self.prefs.overrides.get("prewarm_sessions")
        self.library.prewarm_recent(int(prewarm) if prewarm and prewarm.isdigit() else 3)

    def _show_connected(self) -> None:
        """The status bar's connection and model: the one picked, else the one the
        server said it has loaded (a switch changes it; replies do not)."""
        if not self.connection.ready:
            return
        model = self.models.current or self._server_model
        self.window.connection_label.setText(
            f"● connected to {self.connection.backend.base_url}" + (f" · {model}" if model else "")
        )

    def _on_model_loading(self, name: str) -> None:
        self.window.models.set_loading(name)
        self.window.chat.set_held(bool(name))
        self.window.chat.show_progress(
            f"Loading {name}; messages wait until it is ready…" if name else ""
        )

    def _on_prewarm(self, done: int, total: int) -> None:
        if total == 0 or done >= total:
            self.window.chat.show_progress("")
        else:
            self.window.chat.show_progress(
                f"Warming up recent conversations ({done}/{total})…", done / total
            )

    def _show_location(self) -> None:
        cid = self.chat.current
        if not cid:
            self.window.memory.set_location("")
            return
        where = self.conversations.location(cid)
        tokens = self.conversations.data(
            self.conversations.index(self.conversations.row_of(cid)), Roles.CachedTokens
        )
        text = f"This conversation's cache: {TIER_LABELS[where]}"
        if tokens:
            text += f" ({tokens:,} tokens)"
        self.window.memory.set_location(text)
