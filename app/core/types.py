"""Plain data the app's core hands to its Qt layer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .report import TIERS, ReplyReport


@dataclass(frozen=True)
class Sampling:
    """Sampling sent with each request; ``seed=None`` lets the server choose."""

    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class Finished:
    """The last event of every chat stream, also after a stop."""

    report: ReplyReport


ChatEvent = TextDelta | Finished


@runtime_checkable
class ChatStream(Protocol):
    """The events of one reply. ``cancel()`` may be called from any thread; the
    iteration then ends soon with a ``Finished`` whose finish_reason is "cancelled"."""

    def __iter__(self) -> Iterator[ChatEvent]: ...

    def cancel(self) -> None: ...


@dataclass(frozen=True)
class Health:
    status: str  # "ok" when the model is loaded and replies can start
    model: str | None = None
    progress: float | None = None  # 0..1 while loading, when the server says
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class SessionMessage:
    role: str
    content: str
    interrupted: bool = False  # a reply cut short: the text is what was shown


@dataclass(frozen=True)
class SessionSummary:
    """A conversation the server keeps, with where its KV lives. ``messages`` is filled
    only when one conversation was asked for (``Backend.session``)."""

    id: str
    title: str = ""
    n_tokens: int = 0
    tiers: dict[str, int] = field(default_factory=dict)
    location: str = "none"
    updated: float = 0.0
    created: float = 0.0
    messages: tuple[SessionMessage, ...] = ()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionSummary:
        tiers_raw = data.get("tiers")
        tiers = (
            {t: int(tiers_raw.get(t) or 0) for t in TIERS} if isinstance(tiers_raw, dict) else {}
        )
        location = data.get("location")
        if location not in (*TIERS, "none"):
            location = next((t for t in TIERS if tiers.get(t)), "none")
        raw_messages = data.get("messages")
        messages = tuple(
            SessionMessage(str(m["role"]), str(m["content"]), bool(m.get("interrupted")))
            for m in (raw_messages if isinstance(raw_messages, list) else [])
            if isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role")
        )
        updated = float(data.get("updated") or 0.0)
        return cls(
            id=str(data.get("id", "")),
            title=str(data.get("title") or ""),
            n_tokens=int(data.get("n_tokens") or 0),
            tiers=tiers,
            location=str(location),
            updated=updated,
            created=float(data.get("created") or updated),
            messages=messages,
        )


@dataclass(frozen=True)
class ServerSetting:
    """One threshold the server chose, with its reason ("automatic") or an override."""

    name: str
    value: Any
    reason: str = ""


class Backend(Protocol):
    """What the app needs from a server. ``ApiClient`` speaks HTTP; tests pass fakes.

    Every method may raise :class:`~app.core.errors.AppError`. The warmstart-only
    methods return ``None`` when the server is a plain OpenAI-compatible one.
    """

    base_url: str

    def health(self) -> Health: ...

    def verify(self) -> None:
        """Raises ``UntrustedServer`` when the server is not the one meant (see
        ``ApiClient.verify``); a no-op for a server the user configured."""
        ...

    def models(self) -> list[str]: ...

    def load_model(self, name: str) -> float | None:
        """Loads ``name`` on the server; its load time in ms, or ``None`` when the
        server cannot be asked to (requests that name the model are all there is)."""
        ...

    def chat(
        self,
        messages: list[dict[str, str]],
        *,
        session_id: str,
        model: str | None,
        sampling: Sampling,
    ) -> ChatStream: ...

    def sessions(self, search: str = "") -> list[SessionSummary] | None:
        """The server's conversations, newest first; ``search`` keeps those whose title
        or messages contain it."""
        ...

    def session(self, session_id: str) -> SessionSummary | None:
        """One conversation with its messages; ``None`` when unknown or unsupported."""
        ...

    def delete_session(self, session_id: str) -> None: ...

    def rename_session(self, session_id: str, title: str) -> None: ...

    def import_sessions(self, sessions: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Hands conversations kept by the app over to the server (ids kept); returns
        ``{"imported": [ids], "existing": [ids]}``."""
        ...

    def prewarm(self, session_id: str) -> bool: ...

    def prefill(
        self, messages: list[dict[str, str]], *, session_id: str, model: str | None
    ) -> dict[str, Any] | None:
        """Sends a draft of the conversation (the message being typed last, or none):
        ``{"ready_tokens", "prompt_tokens", "state", ...}``; None when unsupported."""
        ...

    def stats(self) -> dict[str, Any] | None: ...

    def server_settings(self) -> dict[str, ServerSetting] | None: ...
