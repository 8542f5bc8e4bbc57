"""Controllers own the app's behaviour; views only lay out widgets and forward input."""

from app.qt.controllers.chat import ChatController
from app.qt.controllers.connection import ConnectionController
from app.qt.controllers.library import LibraryController
from app.qt.controllers.memory import MemoryController, ReplyPoint

__all__ = [
    "ChatController",
    "ConnectionController",
    "LibraryController",
    "MemoryController",
    "ReplyPoint",
]
