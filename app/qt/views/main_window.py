"""The main window: conversation list, chat, memory panel. Layout and actions only."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QDockWidget,
    QLabel,
    QLineEdit,
    QListView,
    QMainWindow,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from ..models import BADGE_SIZE
from .chat_view import ChatView
from .memory_panel import MemoryPanel
from .model_picker import ModelPicker


class MainWindow(QMainWindow):
    def __init__(self, scheme: str = "light") -> None:
        super().__init__()
        self.setWindowTitle("warmstart")
        self.resize(1280, 800)

        side = QWidget()
        side_layout = QVBoxLayout(side)
        side_layout.setContentsMargins(8, 8, 0, 8)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations (Ctrl+K)")
        self.search.setClearButtonEnabled(True)
        self.new_button = QPushButton("New conversation")
        self.conversations = QListView()
        self.conversations.setUniformItemSizes(True)
        self.conversations.setIconSize(QSize(*BADGE_SIZE))  # else the badge shrinks to 16 px
        self.conversations.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conversations.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.conversations.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)
        side_layout.addWidget(self.new_button)
        side_layout.addWidget(self.search)
        side_layout.addWidget(self.conversations, 1)

        self.chat = ChatView(scheme)
        self.splitter = QSplitter()
        self.splitter.addWidget(side)
        self.splitter.addWidget(self.chat)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([280, 900])
        self.setCentralWidget(self.splitter)

        self.memory = MemoryPanel()
        self.memory_dock = QDockWidget("Memory", self)
        self.memory_dock.setObjectName("memory_dock")
        self.memory_dock.setWidget(self.memory)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.memory_dock)
        self.models = ModelPicker()
        self.models_dock = QDockWidget("Models", self)
        self.models_dock.setObjectName("models_dock")
        self.models_dock.setWidget(self.models)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.models_dock)
        self.tabifyDockWidget(self.memory_dock, self.models_dock)
        self.memory_dock.raise_()  # the memory panel stays what a new window shows

        self.status_label = QLabel("")
        self.connection_label = QLabel("")
        self.statusBar().addWidget(self.status_label, 1)
        self.statusBar().addPermanentWidget(self.connection_label)
        self._actions()

    def _action(self, text: str, shortcut: str | QKeySequence.StandardKey | None = None) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.addAction(action)
        return action

    def _actions(self) -> None:
        self.new_action = self._action("&New conversation", "Ctrl+N")
        self.search_action = self._action("&Search conversations", "Ctrl+K")
        self.settings_action = self._action("Se&ttings…", "Ctrl+,")
        self.quit_action = self._action("&Quit", "Ctrl+Q")
        self.memory_action = self.memory_dock.toggleViewAction()
        self.memory_action.setText("&Memory panel")
        self.memory_action.setShortcut(QKeySequence("Ctrl+M"))
        self.addAction(self.memory_action)
        self.models_action = self.models_dock.toggleViewAction()
        self.models_action.setText("M&odels")
        self.models_action.setShortcut(QKeySequence("Ctrl+Shift+M"))
        self.addAction(self.models_action)
        self.stop_action = self._action("S&top the reply", "Esc")
        self.regenerate_action = self._action("&Regenerate the reply", "Ctrl+R")
        self.edit_action = self._action("&Edit the last message", "Ctrl+E")
        self.copy_action = self._action("&Copy the last reply", "Ctrl+Shift+C")
        self.rename_action = self._action("Re&name…", "F2")
        self.pin_action = self._action("&Pin / unpin", "Ctrl+P")
        self.delete_action = self._action("&Delete…", "Ctrl+Shift+Backspace")
        for action in (self.rename_action, self.pin_action, self.delete_action):
            self.conversations.addAction(action)
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        for a in (self.new_action, self.search_action, self.settings_action, self.quit_action):
            file_menu.addAction(a)
        chat_menu = bar.addMenu("&Conversation")
        for a in (self.stop_action, self.regenerate_action, self.edit_action, self.copy_action):
            chat_menu.addAction(a)
        chat_menu.addSeparator()
        for a in (self.rename_action, self.pin_action, self.delete_action):
            chat_menu.addAction(a)
        view_menu = bar.addMenu("&View")
        view_menu.addAction(self.memory_action)
        view_menu.addAction(self.models_action)
