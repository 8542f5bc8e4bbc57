"""Where the app's conversations live.

Against a warmstart server they live in the server's one session store, which the
command line and the API see too: :class:`ServerHistory` is the app's view of it, a
cache fed by the server's answers (the controllers do the HTTP on worker threads;
this module does none). Against a plain OpenAI-compatible server, which keeps no
conversations, the app keeps them itself: :class:`~app.core.store.ConversationStore`,
as before. Both implement :class:`History`, so the controllers serve either.

The server saves a conversation when a reply ends (the messages sent, and the reply),
so a new conversation is a local draft until its first reply; the server titles it
from its first question, as it does for the command line.
"""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import replace
from typing import Any, Protocol

from .preferences import PreferenceStore
from .report import ReplyReport
from .store import DEFAULT_TITLE, Conversation, ConversationStore, StoredMessage, content_digest
from .types import SessionMessage, SessionSummary

PINNED_KEY = "pinned_conversations"  # pins are the app's own, kept with its preferences


class History(Protocol):
    """The conversations the app lists, opens and continues. Used on the GUI thread."""

    def create(self, title: str = DEFAULT_TITLE, *, model: str | None = None) -> Conversation: ...

    def get(self, cid: str) -> Conversation | None: ...

    def conversations(self, search: str = "") -> list[Conversation]:
        """Pinned first, then the most recently updated."""
        ...

    def rename(self, cid: str, title: str) -> None: ...

    def set_pinned(self, cid: str, pinned: bool) -> None: ...

    def delete(self, cid: str) -> None: ...

    def messages(self, cid: str) -> list[StoredMessage]: ...

    def append(
        self, cid: str, role: str, content: str, report: ReplyReport | None = None
    ) -> StoredMessage: ...

    def truncate(self, cid: str, keep: int) -> None:
        """Drop every message from position ``keep`` on."""
        ...


class ReportStore(Protocol):
    """Where the reports of the server's conversations are kept (the app's database:
    :class:`~app.core.store.ConversationStore`)."""

    def keep_report(self, cid: str, position: int, content: str, report: ReplyReport) -> None: ...

    def kept_reports(self, cid: str) -> dict[int, tuple[str, ReplyReport]]: ...

    def drop_reports(self, cid: str, keep: int = 0) -> None: ...


def kept_session(conv: Conversation, messages: list[StoredMessage]) -> dict[str, Any]:
    """One conversation of the app's own database, as ``POST sessions/import`` takes it."""
    return {
        "id": conv.id,
        "title": conv.title if conv.title != DEFAULT_TITLE else "",
        "created": conv.created,
        "updated": conv.updated,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
    }


class ServerHistory:
    """The server's conversations as last listed, plus the drafts not saved there yet,
    and the messages of those opened so far."""

    def __init__(self, prefs: PreferenceStore, reports: ReportStore | None = None) -> None:
        """``reports``: where each reply's cache report is kept, to show it again when
        the conversation is opened after a restart (None: for this run only)."""
        self._prefs = prefs
        self._reports = reports
        self._pinned = set(prefs.preference(PINNED_KEY, []) or [])
        self._listed: dict[str, Conversation] = {}
        self._drafts: dict[str, Conversation] = {}
        self._messages: dict[str, list[StoredMessage]] = {}
        self._seen: dict[str, float] = {}  # the server's `updated` our messages match
        self._busy: set[str] = set()  # a reply is on its way: the server is about to save
        self._gone: set[str] = set()  # deleted here; a listing may predate the deletion
        self._titles: dict[str, str] = {}  # given to drafts: the server learns them later
        self._titles_sent: set[str] = set()
        self._found: tuple[str, set[str]] = ("", set())  # the server's answer to a search
        self._ids = itertools.count(1)
        self.synced = False  # True once the server's list has arrived

    # -- what the server said ------------------------------------------------------------

    def apply_list(self, sessions: list[SessionSummary]) -> tuple[bool, set[str]]:
        """Takes the server's list. Returns whether the list changed, and the opened
        conversations the server saved again since their messages were read here (our
        own reply, or another client going on with them): the caller reads those again
        (:meth:`refresh`) or lets them go (:meth:`forget`)."""
        self._gone &= {s.id for s in sessions}
        sessions = [s for s in sessions if s.id not in self._gone]
        listed = {s.id: self._conversation(s) for s in sessions}
        changed = listed != self._listed or not self.synced
        suspects: set[str] = set()
        for s in sessions:
            self._drafts.pop(s.id, None)
            if self._titles.get(s.id) == s.title:  # the server has the user's title now
                del self._titles[s.id]
                self._titles_sent.discard(s.id)
            opened = s.id in self._messages and s.id not in self._busy
            if opened and self._seen.get(s.id) != s.updated:
                suspects.add(s.id)
        for cid in set(self._listed) - set(listed) - set(self._drafts):
            self.forget(cid)  # deleted elsewhere
        self._listed, self.synced = listed, True
        return changed, suspects

    def _conversation(self, s: SessionSummary) -> Conversation:
        updated = s.updated or time.time()
        title = self._titles.get(s.id) or s.title or DEFAULT_TITLE
        return Conversation(s.id, title, s.id in self._pinned, s.created or updated, updated)

    def is_draft(self, cid: str) -> bool:
        return cid in self._drafts

    def title_later(self, cid: str, title: str) -> None:
        """The user named a draft, which the server does not know yet: the title is
        shown here and handed over by :meth:`titles_due` once the server lists it."""
        self._titles[cid] = title.strip()

    def titles_due(self) -> dict[str, str]:
        """Titles given to drafts that the server now lists: to send, once."""
        due = {
            cid: t
            for cid, t in self._titles.items()
            if cid in self._listed and cid not in self._titles_sent
        }
        self._titles_sent |= set(due)
        return due

    def loaded(self, cid: str) -> bool:
        return cid in self._messages

    def set_messages(self, cid: str, session: SessionSummary) -> list[StoredMessage]:
        """The messages the server keeps for ``cid``; its system prompt is the app's
        setting, not a message, so it is not shown (the app sends its own)."""
        shown = [m for m in session.messages if m.role != "system"]
        kept = self._reports.kept_reports(cid) if self._reports is not None else {}
        self._messages[cid] = [
            StoredMessage(next(self._ids), cid, i, m.role, m.content, _report_for(kept, i, m))
            for i, m in enumerate(shown)
        ]
        self._seen[cid] = session.updated
        return list(self._messages[cid])

    def refresh(self, cid: str, session: SessionSummary) -> bool:
        """The server's messages of ``cid`` again: True when they differ from those here
        (which are then replaced), False when they are the same (and the reports of
        this run's replies stay)."""
        shown = [(m.role, m.content) for m in session.messages if m.role != "system"]
        if shown == [(m.role, m.content) for m in self._messages.get(cid, [])]:
            self._seen[cid] = session.updated
            return False
        self.set_messages(cid, session)
        return True

    def forget(self, cid: str) -> None:
        """Drops what is cached of ``cid``'s messages; opening it reads them again."""
        self._messages.pop(cid, None)
        self._seen.pop(cid, None)

    def hold(self, cid: str) -> None:
        """A reply to ``cid`` is on its way: the server saves it as it ends, so its
        listing is not compared until :meth:`release`."""
        self._busy.add(cid)

    def release(self, cid: str) -> None:
        self._busy.discard(cid)

    # -- History ---------------------------------------------------------------------------

    def create(self, title: str = DEFAULT_TITLE, *, model: str | None = None) -> Conversation:
        now = time.time()
        conv = Conversation(uuid.uuid4().hex, title, False, now, now, model)
        self._drafts[conv.id] = conv
        self._messages[conv.id] = []
        return conv

    def get(self, cid: str) -> Conversation | None:
        return self._drafts.get(cid) or self._listed.get(cid)

    def conversations(self, search: str = "") -> list[Conversation]:
        rows = [*self._drafts.values(), *self._listed.values()]
        needle = search.strip().casefold()
        if needle:
            # Titles and the text of the conversations opened here at once, and what the
            # server found in the rest (its list carries no messages) when it answers.
            found = self._found[1] if self._found[0] == needle else set()
            rows = [
                c
                for c in rows
                if needle in c.title.casefold() or c.id in found or self._says(c.id, needle)
            ]
        return sorted(rows, key=lambda c: (not c.pinned, -c.updated))

    def set_found(self, search: str, sessions: list[SessionSummary]) -> None:
        """The server's answer to ``sessions(search)``."""
        self._found = (search.strip().casefold(), {s.id for s in sessions})

    def _says(self, cid: str, needle: str) -> bool:
        return any(needle in m.content.casefold() for m in self._messages.get(cid, []))

    def _update(self, cid: str, **changes: Any) -> None:
        for table in (self._drafts, self._listed):
            if cid in table:
                table[cid] = replace(table[cid], **changes)

    def rename(self, cid: str, title: str) -> None:
        self._update(cid, title=title.strip())

    def set_pinned(self, cid: str, pinned: bool) -> None:
        (self._pinned.add if pinned else self._pinned.discard)(cid)
        self._prefs.set_preference(PINNED_KEY, sorted(self._pinned))
        self._update(cid, pinned=pinned)

    def delete(self, cid: str) -> None:
        self._gone.add(cid)
        self._drafts.pop(cid, None)
        self._listed.pop(cid, None)
        self.forget(cid)
        if self._reports is not None:
            self._reports.drop_reports(cid)
        if cid in self._pinned:
            self.set_pinned(cid, False)

    def messages(self, cid: str) -> list[StoredMessage]:
        return list(self._messages.get(cid, []))

    def append(
        self, cid: str, role: str, content: str, report: ReplyReport | None = None
    ) -> StoredMessage:
        messages = self._messages.setdefault(cid, [])
        msg = StoredMessage(next(self._ids), cid, len(messages), role, content, report)
        messages.append(msg)
        if report is not None and self._reports is not None:
            self._reports.keep_report(cid, msg.position, content, report)
        self._update(cid, updated=time.time())
        return msg

    def truncate(self, cid: str, keep: int) -> None:
        if self._reports is not None:
            self._reports.drop_reports(cid, keep)
        if cid in self._messages:
            self._messages[cid] = [m for m in self._messages[cid] if m.position < keep]


def _report_for(
    kept: dict[int, tuple[str, ReplyReport]], position: int, message: SessionMessage
) -> ReplyReport | None:
    """The kept report of the reply at ``position``, if it is still that reply (another
    client may have gone on with the conversation, or it was regenerated elsewhere)."""
    if message.role != "assistant" or position not in kept:
        return None
    digest, report = kept[position]
    return report if digest == content_digest(message.content) else None


# -- handing the app's own database over to its local server -----------------------------

IMPORTED_KEY = "history_handed_over"  # when, and how many, for the record


def to_hand_over(store: ConversationStore) -> list[dict[str, Any]]:
    """The conversations of the app's own database that have messages, as the server's
    import takes them (the app kept them before the server kept them all)."""
    out = []
    for conv in store.conversations():
        messages = store.messages(conv.id)
        if messages:
            out.append(kept_session(conv, messages))
    return out


def handed_over(
    store: ConversationStore, server: ServerHistory, result: dict[str, Any] | None
) -> int:
    """After the server answered the import: each conversation it now holds (imported
    now, or by an earlier try cut short) leaves the app's database, its pin kept, so
    there is one copy and a repeated start imports nothing twice. Empty ones go too.
    Returns how many the server holds now; nothing is deleted without its word."""
    if not isinstance(result, dict):
        return 0
    held = {str(i) for key in ("imported", "existing") for i in result.get(key) or []}
    for conv in store.conversations():
        if conv.id in held or not store.messages(conv.id):
            if conv.pinned and conv.id in held:
                server.set_pinned(conv.id, True)
            store.delete(conv.id)
    store.set_preference(IMPORTED_KEY, {"at": time.time(), "count": len(held)})
    return len(held)
