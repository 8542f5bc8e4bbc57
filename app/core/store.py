"""The app's preferences, and its own conversations, in one local SQLite file.

Against a warmstart server the conversations live in the server's store (see
:mod:`app.core.history`); this file keeps them only for a plain OpenAI-compatible
server, which keeps none, and until they are handed over to the app's local server.
Used from the GUI thread only (each call is a few milliseconds on a local file).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import StoreError
from .migrations import migrate
from .private import private_dir, private_file
from .report import ReplyReport
from .secret_store import SecretStore

DEFAULT_TITLE = "New conversation"


@dataclass(frozen=True)
class Conversation:
    id: str
    title: str
    pinned: bool
    created: float
    updated: float
    model: str | None = None


@dataclass(frozen=True)
class StoredMessage:
    id: int
    conversation_id: str
    position: int
    role: str
    content: str
    report: ReplyReport | None = None

    def as_api(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def content_digest(content: str) -> str:
    """Which reply a kept report belongs to (the server may trim what it saves)."""
    return hashlib.sha256(content.strip().encode()).hexdigest()


def _conversation(row: sqlite3.Row) -> Conversation:
    return Conversation(
        row["id"], row["title"], bool(row["pinned"]), row["created"], row["updated"], row["model"]
    )


def _message(row: sqlite3.Row) -> StoredMessage:
    report = ReplyReport.from_json(json.loads(row["report"])) if row["report"] else None
    return StoredMessage(
        row["id"], row["conversation_id"], row["position"], row["role"], row["content"], report
    )


def _make_private(path: Path) -> None:
    """Conversations are the user's private text: the directory 0700, the database
    0600 before SQLite opens it (SQLite gives its -wal and -shm files the database's
    mode), and any -wal or -shm left looser by an older version tightened."""
    private_dir(path.parent)
    private_file(path, create=True)
    for suffix in ("-wal", "-shm", "-journal"):
        private_file(path.with_name(path.name + suffix))


class ConversationStore:
    def __init__(self, path: Path | str, secrets: SecretStore | None = None) -> None:
        """``secrets`` receives an API key that an older version kept in the database."""
        if path != ":memory:":
            _make_private(Path(path))
        try:
            self._db = sqlite3.connect(str(path), isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.execute("PRAGMA journal_mode = WAL")
            # Deleted conversations are overwritten, not just unlinked from the b-tree.
            self._db.execute("PRAGMA secure_delete = ON")
            if migrate(self._db, secrets):
                self._checkpoint()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open the conversation database {path}: {exc}") from exc

    def close(self) -> None:
        self._db.close()

    def _checkpoint(self) -> None:
        """Folds the WAL into the database and empties it, so deleted text is in no file."""
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _write(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, args)
        except sqlite3.DatabaseError as exc:
            raise StoreError(str(exc)) from exc

    # -- conversations ---------------------------------------------------------------

    def create(
        self, title: str = DEFAULT_TITLE, *, model: str | None = None, cid: str | None = None
    ) -> Conversation:
        """``cid``: keep a conversation's id (a draft begun before the server answered)."""
        now = time.time()
        cid = cid or uuid.uuid4().hex
        self._write(
            "INSERT INTO conversations (id, title, created, updated, model) VALUES (?,?,?,?,?)",
            (cid, title, now, now, model),
        )
        return Conversation(cid, title, False, now, now, model)

    def get(self, cid: str) -> Conversation | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (cid,)).fetchone()
        return _conversation(row) if row else None

    def conversations(self, search: str = "") -> list[Conversation]:
        """Pinned first, then the most recently updated. ``search`` matches titles and
        message text, case-insensitively."""
        sql = "SELECT * FROM conversations"
        args: dict[str, Any] = {}
        if search.strip():
            like = "%" + search.strip().replace("\\", "\\\\").replace("%", "\\%") + "%"
            # a named parameter used twice: Python 3.12 deprecates "?1" with a sequence
            sql += (
                " WHERE title LIKE :like ESCAPE '\\' OR id IN (SELECT conversation_id FROM"
                " messages WHERE content LIKE :like ESCAPE '\\')"
            )
            args = {"like": like}
        sql += " ORDER BY pinned DESC, updated DESC"
        return [_conversation(r) for r in self._db.execute(sql, args)]

    def rename(self, cid: str, title: str) -> None:
        self._write("UPDATE conversations SET title = ? WHERE id = ?", (title.strip(), cid))

    def set_pinned(self, cid: str, pinned: bool) -> None:
        self._write("UPDATE conversations SET pinned = ? WHERE id = ?", (int(pinned), cid))

    def delete(self, cid: str) -> None:
        self._write("DELETE FROM conversations WHERE id = ?", (cid,))
        self._checkpoint()

    def touch(self, cid: str) -> None:
        self._write("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), cid))

    # -- messages ----------------------------------------------------------------------

    def messages(self, cid: str) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY position", (cid,)
        )
        return [_message(r) for r in rows]

    def append(
        self, cid: str, role: str, content: str, report: ReplyReport | None = None
    ) -> StoredMessage:
        row = self._db.execute(
            "SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE conversation_id = ?", (cid,)
        ).fetchone()
        position = int(row[0])
        cur = self._write(
            "INSERT INTO messages (conversation_id, position, role, content, created, report)"
            " VALUES (?,?,?,?,?,?)",
            (cid, position, role, content, time.time(), self._report(report)),
        )
        self.touch(cid)
        return StoredMessage(int(cur.lastrowid or 0), cid, position, role, content, report)

    def update(self, message_id: int, content: str, report: ReplyReport | None = None) -> None:
        self._write(
            "UPDATE messages SET content = ?, report = ? WHERE id = ?",
            (content, self._report(report), message_id),
        )

    def truncate(self, cid: str, keep: int) -> None:
        """Drop every message from position ``keep`` on (regenerate, edit-and-resend)."""
        self._write("DELETE FROM messages WHERE conversation_id = ? AND position >= ?", (cid, keep))

    @staticmethod
    def _report(report: ReplyReport | None) -> str | None:
        return json.dumps(report.to_json()) if report else None

    # -- the reports of the server's conversations -------------------------------------

    def keep_report(self, cid: str, position: int, content: str, report: ReplyReport) -> None:
        """What the server reported for the reply at ``position`` of a conversation it
        keeps (it keeps the reply's text, not the report the app showed under it)."""
        self._write(
            "INSERT OR REPLACE INTO reply_reports VALUES (?,?,?,?)",
            (cid, position, content_digest(content), self._report(report)),
        )

    def kept_reports(self, cid: str) -> dict[int, tuple[str, ReplyReport]]:
        """Position -> (the digest of the reply it was for, its report)."""
        rows = self._db.execute(
            "SELECT position, content_sha256, report FROM reply_reports WHERE conversation_id = ?",
            (cid,),
        )
        return {int(r[0]): (str(r[1]), ReplyReport.from_json(json.loads(r[2]))) for r in rows}

    def drop_reports(self, cid: str, keep: int = 0) -> None:
        """Forgets the reports from position ``keep`` on (all: the conversation is gone)."""
        self._write(
            "DELETE FROM reply_reports WHERE conversation_id = ? AND position >= ?", (cid, keep)
        )

    # -- preferences -------------------------------------------------------------------

    def preference(self, key: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM preferences WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set_preference(self, key: str, value: Any) -> None:
        self._write(
            "INSERT INTO preferences (key, value) VALUES (?, ?)"
            " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, json.dumps(value)),
        )
