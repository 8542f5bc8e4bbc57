"""Controllers own the app's behaviour; views only lay out widgets and forward input."""

from .chat import ChatController
from .connection import ConnectionController
from .drafts import DraftController
from .library import LibraryController
from .memory import MemoryController, ReplyPoint
from .models import ModelController

__all__ = [
    "ChatController",
    "ConnectionController",
    "DraftController",
    "LibraryController",
    "MemoryController",
    "ModelController",
    "ReplyPoint",
]
