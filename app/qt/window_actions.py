"""What the window's buttons, menus and list ask for: a new conversation, send, edit,
open, rename, pin, delete, and the list's selection following the open conversation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QItemSelectionModel, QModelIndex
from PySide6.QtWidgets import QInputDialog, QMessageBox

from ..core.history import History
from ..core.store import Conversation
from .controllers import ChatController, LibraryController, ModelController
from .models import ConversationListModel, Roles
from .views.main_window import MainWindow


@dataclass(eq=False)
class WindowActions:
    """``history`` reads where the conversations live now (it changes when the server's
    kind is known)."""

    window: MainWindow
    chat: ChatController
    models: ModelController
    library: LibraryController
    conversations: ConversationListModel
    history: Callable[[], History]

    def new_conversation(self) -> None:
        self.window.search.clear()
        self.chat.new_conversation()
        self.window.chat.composer.setFocus()

    def focus_search(self) -> None:
        self.window.search.setFocus()
        self.window.search.selectAll()

    def send(self, text: str) -> None:
        if self.models.loading:  # the reply would come from the model being replaced
            return
        if self.chat.send(text):
            self.window.chat.composer.clear()

    def edit_last(self) -> None:
        text = self.chat.edit_last()
        if text is not None:
            self.window.chat.set_draft(text)
            self.window.status_label.setText("Editing the last message: Enter resends it.")

    def open_index(self, index: QModelIndex) -> None:
        cid = self.conversations.data(index, Roles.Id)
        if cid and cid != self.chat.current:
            self.chat.open(cid)

    def select(self, cid: str | None) -> None:
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
        return self.history().get(cid) if cid else None

    def rename_selected(self) -> None:
        conv = self._selected_conversation()
        if conv is None:
            return
        title, ok = QInputDialog.getText(self.window, "Rename", "Title", text=conv.title)
        if ok:
            self.library.rename(conv.id, title)
            self.select(conv.id)

    def pin_selected(self) -> None:
        cid = self._selected_id()
        if cid:
            self.library.toggle_pinned(cid)
            self.select(cid)

    def delete_selected(self) -> None:
        conv = self._selected_conversation()
        if conv is None:
            return
        answer = QMessageBox.question(
            self.window, "Delete conversation", f"Delete “{conv.title}” and its cached context?"
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.library.delete(conv.id)

    def deleted(self, cid: str) -> None:
        """The open conversation was deleted: the next one opens (or a new one)."""
        if cid == self.chat.current:
            rest = self.history().conversations()
            self.chat.open(rest[0].id if rest else None)
