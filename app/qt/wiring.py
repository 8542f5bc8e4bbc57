"""The connections between the window's views, the controllers and the app, made once
at construction. Qt calls a signal's slots in the order they were connected, so the
sections run in this order and keep it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtGui import QGuiApplication

from .feedback import Feedback

if TYPE_CHECKING:
    from .application import WarmstartApp


def wire(app: WarmstartApp) -> None:
    _chat(app)
    _conversation_list(app)
    _memory(app)
    _connection(app)
    _models(app)
    _menus(app)


def _chat(app: WarmstartApp) -> None:
    """The chat view <-> the chat controller."""
    w, chat, view = app.window, app.chat, app.window.chat
    view.send_requested.connect(app.actions.send)
    view.stop_requested.connect(chat.stop)
    view.regenerate_requested.connect(chat.regenerate)
    view.edit_requested.connect(app.actions.edit_last)
    view.copy_requested.connect(lambda text: QGuiApplication.clipboard().setText(text))
    chat.opened.connect(lambda _cid, msgs: view.set_messages(msgs))
    chat.opened.connect(lambda cid, _m: app.actions.select(cid))
    chat.opened.connect(lambda _c, _m: app.feedback.show_location())
    chat.message_added.connect(view.add_message)
    chat.truncated.connect(view.truncate)
    chat.reply_started.connect(view.start_reply)
    chat.reply_delta.connect(view.append_delta)
    chat.reply_finished.connect(view.finish_reply)
    chat.busy_changed.connect(view.set_busy)
    chat.status.connect(w.status_label.setText)
    chat.error.connect(app.feedback.chat_error)
    chat.conversations_changed.connect(app.library.reload)
    chat.conversations_changed.connect(lambda: app.actions.select(chat.current))
    chat.report_received.connect(app.memory.add_report)
    view.draft_edited.connect(app.drafts.edited)
    app.drafts.ready.connect(view.set_ready)
    chat.opened.connect(
        lambda cid, msgs: app.memory.recall(cid, [m.report for m in msgs if m.report])
    )


def _conversation_list(app: WarmstartApp) -> None:
    w, chat, library = app.window, app.chat, app.library
    w.conversations.clicked.connect(app.actions.open_index)
    w.conversations.activated.connect(app.actions.open_index)
    w.search.textChanged.connect(library.set_search)
    w.search.textChanged.connect(lambda _t: app.actions.select(chat.current))
    library.deleted.connect(app.actions.deleted)
    library.synced.connect(app.on_synced)
    library.prewarm_progress.connect(app.feedback.prewarm)


def _memory(app: WarmstartApp) -> None:
    panel, memory = app.window.memory, app.memory
    memory.snapshot.connect(panel.set_snapshot)
    memory.sessions.connect(app.library.apply_sessions)
    memory.sessions.connect(lambda _s: app.feedback.show_location())
    memory.history_changed.connect(panel.set_history)
    memory.last_report.connect(panel.set_last_report)


def _connection(app: WarmstartApp) -> None:
    w, conn, feedback = app.window, app.connection, app.feedback
    conn.message.connect(feedback.connection_message)
    conn.progress.connect(feedback.progress)
    conn.state_changed.connect(lambda s: w.connection_label.setText(Feedback.state_text(s)))
    conn.became_ready.connect(app.on_ready)
    conn.capabilities.connect(lambda ok: None if ok else w.memory.set_snapshot(None))
    conn.capabilities.connect(app.use_history)


def _models(app: WarmstartApp) -> None:
    w, picker, models = app.window, app.window.models, app.models
    picker.use_requested.connect(models.use)
    picker.download_requested.connect(models.download)
    picker.cancel_requested.connect(models.cancel_download)
    models.listed.connect(picker.set_models)
    models.current_changed.connect(picker.set_current)
    models.current_changed.connect(lambda _name: app.feedback.show_connected())
    models.loading_changed.connect(app.feedback.model_loading)
    models.download_progress.connect(picker.set_download)
    models.error.connect(lambda text: w.chat.show_error(text, "models"))
    models.status.connect(w.status_label.setText)
    picker.set_current(models.current)
    picker.set_can_download(models.can_download)


def _menus(app: WarmstartApp) -> None:
    """The window's buttons and menu actions."""
    w, chat, actions = app.window, app.chat, app.actions
    w.new_button.clicked.connect(actions.new_conversation)
    w.new_action.triggered.connect(actions.new_conversation)
    w.search_action.triggered.connect(actions.focus_search)
    w.settings_action.triggered.connect(app.open_settings)
    w.quit_action.triggered.connect(w.close)
    w.stop_action.triggered.connect(chat.stop)
    w.regenerate_action.triggered.connect(chat.regenerate)
    w.edit_action.triggered.connect(actions.edit_last)
    w.copy_action.triggered.connect(lambda: QGuiApplication.clipboard().setText(chat.last_reply()))
    w.rename_action.triggered.connect(actions.rename_selected)
    w.pin_action.triggered.connect(actions.pin_selected)
    w.delete_action.triggered.connect(actions.delete_selected)
