"""What the window says about the state of things: the status bar's connection and
model, the chat's banners (errors and progress) and the cache line of the open
conversation."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.report import TIER_LABELS
from .controllers import ChatController, ConnectionController, ModelController
from .models import ConversationListModel, Roles
from .views.main_window import MainWindow


@dataclass(eq=False)
class Feedback:
    window: MainWindow
    connection: ConnectionController
    models: ModelController
    chat: ChatController
    conversations: ConversationListModel
    # the model the server said it had loaded, at connecting
    _server_model: str = field(default="", init=False)

    @staticmethod
    def state_text(state: str) -> str:
        return {
            "connecting": "● connecting",
            "starting": "● starting the server",
            "ready": "● connected",
            "down": "● server down",
        }.get(state, state)

    def chat_error(self, text: str) -> None:
        # A reply lost with the server is the connection's reason, gone when it is back;
        # any other stays until the user dismisses it or sends again.
        lost = bool(text) and self.connection.state == "down"
        self.window.chat.show_error(text, "connection" if lost else "chat")

    def connection_message(self, text: str) -> None:
        # The connection clears only its own reason: a failed reply's or a model's
        # stays until the user dismisses it (the 3-second health poll used to wipe it).
        if self.connection.state == "down":
            self.window.chat.show_error(text, "connection")
        elif self.connection.state == "ready":
            self.window.chat.show_error("", "connection")
        else:
            self.window.chat.show_progress(text)

    def progress(self, text: str, fraction: object) -> None:
        frac = float(fraction) if isinstance(fraction, int | float) else None
        if text:
            self.window.chat.show_progress(text, frac)
        else:
            self.window.chat.show_progress("")

    def ready(self, health: object) -> None:
        """Connected: the status bar names the server, the connection's banners go."""
        model = getattr(health, "model", None)
        self._server_model = str(model) if model else ""
        self.show_connected()
        self.window.chat.show_error("", "connection")
        self.window.chat.show_progress("")
        if self.models.loading:
            self.model_loading(self.models.loading)

    def show_connected(self) -> None:
        """The status bar's connection and model: the one picked, else the one the
        server said it has loaded (a switch changes it; replies do not)."""
        if not self.connection.ready:
            return
        model = self.models.current or self._server_model
        self.window.connection_label.setText(
            f"● connected to {self.connection.backend.base_url}" + (f" · {model}" if model else "")
        )

    def model_loading(self, name: str) -> None:
        self.window.models.set_loading(name)
        self.window.chat.set_held(bool(name))
        self.window.chat.show_progress(
            f"Loading {name}; messages wait until it is ready…" if name else ""
        )

    def prewarm(self, done: int, total: int) -> None:
        if total == 0 or done >= total:
            self.window.chat.show_progress("")
        else:
            self.window.chat.show_progress(
                f"Warming up recent conversations ({done}/{total})…", done / total
            )

    def show_location(self) -> None:
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
