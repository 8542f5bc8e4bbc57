"""Conversations the runtime has served, kept in SQLite (with migrations).

A session remembers its messages (so `warmstart chat` can resume it) and the key
of the last KV chunk of its prompt (so its cached prefix can be found, measured
per tier, prewarmed or deleted). Deleting the KV cache never deletes sessions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
import unicodedata
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import sqlite
from .._private import private_dir
from ..errors import CacheError, RequestError
from ..types import Message, SessionInfo, StoredResponse, ToolCall

log = logging.getLogger(__name__)
DEFAULT_TITLE = "New conversation"
MIGRATIONS = [
    (
        "0001_sessions",
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, title TEXT NOT NULL, "
        "created REAL NOT NULL, updated REAL NOT NULL, n_tokens INTEGER NOT NULL DEFAULT 0, "
        "fingerprint TEXT, leaf BLOB, messages TEXT NOT NULL DEFAULT '[]');"
        "CREATE INDEX sessions_by_updated ON sessions (updated)",
    ),
    (
        # Requests that name no conversation (plain OpenAI and Ollama clients, curl) get
        # a derived id; they are kept for their cache but listed only on request, so
        # the list stays the user's chats. Rows from before: a derived id is "c" and 12
        # hex digits, which neither the CLI's nor the app's ids are.
        "0002_anonymous",
        "ALTER TABLE sessions ADD COLUMN anonymous INTEGER NOT NULL DEFAULT 0;"
        f"UPDATE sessions SET anonymous = 1 WHERE id GLOB 'c{'[0-9a-f]' * 12}'",
    ),
    (
        # Replies of the Responses API, kept so a later request continues one by its id
        # (previous_response_id): the conversation through it, and the body sent.
        "0003_responses",
        "CREATE TABLE responses (id TEXT PRIMARY KEY, session_id TEXT, "
        "named INTEGER NOT NULL, created REAL NOT NULL, messages TEXT NOT NULL, "
        "body TEXT NOT NULL);"
        "CREATE INDEX responses_by_session ON responses (session_id)",
    ),
    (
        # A household server: each conversation and stored response is its user's
        # (runtime/users.py). Rows from before are the local user's (""). Two users may
        # name a conversation alike (or send the same opening, the same derived id),
        # so the key is (owner, id); the table is built again for it.
        "0004_owners",
        "CREATE TABLE sessions_owned (id TEXT NOT NULL, title TEXT NOT NULL, "
        "created REAL NOT NULL, updated REAL NOT NULL, n_tokens INTEGER NOT NULL DEFAULT 0, "
        "fingerprint TEXT, leaf BLOB, messages TEXT NOT NULL DEFAULT '[]', "
        "anonymous INTEGER NOT NULL DEFAULT 0, owner TEXT NOT NULL DEFAULT '', "
        "PRIMARY KEY (owner, id));"
        "INSERT INTO sessions_owned SELECT *, '' FROM sessions;"
        "DROP TABLE sessions;"
        "ALTER TABLE sessions_owned RENAME TO sessions;"
        "CREATE INDEX sessions_by_updated ON sessions (updated);"
        "ALTER TABLE responses ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
    ),
]


@dataclass(frozen=True)
class SessionRow:
    id: str
    title: str
    created: float
    updated: float
    n_tokens: int
    fingerprint: str | None
    leaf: bytes | None
    messages: tuple[Message, ...]
    anonymous: bool = False  # its requests named no conversation (a derived id)
    owner: str = ""  # whose it is (runtime/users.py Caller.owner; "" the local user)


MAX_SESSION_ID = 256  # characters
SESSION_ID_RULE = (
    f"a session id is a name of 1 to {MAX_SESSION_ID} characters without '/', '\\', "
    "'..' or control characters"
)


def session_id_problem(value: str) -> str | None:
    """What makes ``value`` unfit to name a new session, or None when it is fine.

    Ids end up in URL paths and on terminals: a slash or a '..' reads as a path there
    (such a session could not be read back through its URL), a control character
    rewrites what a terminal shows."""
    if not value:
        return "is empty"
    if len(value) > MAX_SESSION_ID:
        return f"is {len(value)} characters long"
    if "/" in value or "\\" in value:
        return "contains a slash"
    if ".." in value:
        return "contains '..'"
    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp"):
            return f"contains the control character U+{ord(ch):04X}"
    return None


def check_session_id(value: str, param: str = "session_id") -> str:
    """``value`` when it may name a new session; else RequestError naming ``param``."""
    problem = session_id_problem(value)
    if problem is not None:
        shown = value if len(value) <= 64 else value[:61] + "..."
        raise RequestError(f"{param}: {shown!r} {problem}; {SESSION_ID_RULE}", param=param)
    return value


def new_session_id() -> str:
    return uuid.uuid4().hex[:12]


def derived_session_id(messages: tuple[Message, ...]) -> str | None:
    """A stable id for clients that send none: the conversation's opening (system
    prompt and first user message) names it, so its later turns land in it."""
    opening = [m for m in messages if m.role == "system"][:1]
    opening += [m for m in messages if m.role == "user"][:1]
    if not opening:
        return None
    text = "\0".join(f"{m.role}:{m.content}" for m in opening)
    return "c" + hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def title_of(messages: tuple[Message, ...]) -> str:
    for m in messages:
        if m.role == "user" and m.content.strip():
            line = " ".join(m.content.split())
            return line if len(line) <= 60 else line[:57] + "..."
    return DEFAULT_TITLE


def _as_json(m: Message) -> dict[str, object]:
    """A message as stored; the tool fields only where set, so rows written before
    tools existed and rows without them read the same."""
    out: dict[str, object] = {"role": m.role, "content": m.content}
    if m.interrupted:
        out["interrupted"] = True
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _from_json(m: dict[str, Any]) -> Message:
    calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in m.get("tool_calls", ()))
    return Message(
        m["role"],
        m["content"],
        bool(m.get("interrupted")),
        tool_calls=calls,
        tool_call_id=m.get("tool_call_id"),
        name=m.get("name"),
    )


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _open(path: Path) -> sqlite3.Connection:
    """The database, or a fresh one when the file is damaged: the server starts and
    keeps new conversations, the damaged file is kept under another name for
    recovery, and the log says where. (The KV cache degrades the same way: a damaged
    cache database leaves the cache running from RAM.) Any other failure (locked,
    unreadable, disk full) is raised: a fresh file would hide the conversations."""
    try:
        return sqlite.connect(path, MIGRATIONS, check=True)
    except CacheError as exc:
        if not sqlite.is_damaged(exc):
            raise
        problem = exc.__cause__
    aside = sqlite.set_aside(path)
    log.error(
        "the sessions database %s is damaged (%s): moved it to %s and started an empty "
        "one; the conversations it listed are not shown",
        path,
        problem,
        aside,
    )
    return sqlite.connect(path, MIGRATIONS)


class SessionBook:
    """``keep_text=False`` (the ``history`` setting off) keeps no conversation text:
    sessions are listed with their token counts and cache keys, without title or
    messages."""

    def __init__(self, path: Path, keep_text: bool = True) -> None:
        private_dir(path.parent, "data_dir")
        self._db = _open(path)
        self._lock = threading.Lock()
        self.keep_text = keep_text

    def _row(self, r: tuple) -> SessionRow:  # type: ignore[type-arg]
        messages = tuple(_from_json(m) for m in json.loads(r[7]))
        return SessionRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], messages, bool(r[8]), r[9])

    def get(self, session_id: str, owner: str = "") -> SessionRow | None:
        """``owner``'s conversation of this id (another user's is None, as unknown)."""
        with self._lock:
            r = self._db.execute(
                "SELECT * FROM sessions WHERE owner = ? AND id = ?", (owner, session_id)
            ).fetchone()
        return self._row(r) if r else None

    def list(
        self, limit: int = 1000, search: str = "", anonymous: bool = True, owner: str | None = ""
    ) -> list[SessionRow]:
        """``owner``'s conversations (None: everyone's), newest first; ``search`` keeps
        those whose title or messages contain it (case-insensitive for ASCII letters,
        as SQLite's LIKE); ``anonymous`` False leaves out the conversations whose
        requests named none."""
        where = " WHERE (anonymous = 0 OR ?)"
        args: list[object] = [int(anonymous)]
        if owner is not None:
            where += " AND owner = ?"
            args.append(owner)
        if search.strip():
            where += " AND (title LIKE ? ESCAPE '\\' OR messages LIKE ? ESCAPE '\\')"
            # the messages are JSON text: the words are matched as JSON writes them
            args += [_like(search.strip()), _like(json.dumps(search.strip())[1:-1])]
        with self._lock:
            rows = self._db.execute(
                f"SELECT * FROM sessions{where} ORDER BY updated DESC LIMIT ?", (*args, limit)
            ).fetchall()
        return [self._row(r) for r in rows]

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])

    def save(
        self,
        session_id: str,
        messages: tuple[Message, ...],
        n_tokens: int,
        fingerprint: str | None,
        leaf: bytes | None,
        anonymous: bool = False,
        owner: str = "",
    ) -> None:
        """Creates or updates a session; a None ``leaf`` keeps the one it had. A turn
        that names the session (``anonymous`` False) makes it a listed one for good."""
        now = time.time()
        if not self.keep_text:
            messages = ()
        payload = json.dumps([_as_json(m) for m in messages])
        with self._lock:
            self._db.execute(
                "INSERT INTO sessions (id, title, created, updated, n_tokens, fingerprint, leaf,"
                " messages, anonymous, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(owner, id) DO "
                "UPDATE SET anonymous=MIN(anonymous, excluded.anonymous), "
                # an imported or empty conversation titles itself at its first turn
                f"title=CASE WHEN title IN ('', '{DEFAULT_TITLE}') THEN excluded.title "
                "ELSE title END, updated=excluded.updated, n_tokens=excluded.n_tokens, "
                "fingerprint=COALESCE(excluded.fingerprint, fingerprint), "
                "leaf=COALESCE(excluded.leaf, leaf), messages=excluded.messages",
                (
                    *(session_id, self._title(messages), now, now, n_tokens, fingerprint),
                    *(leaf, payload, int(anonymous), owner),
                ),
            )

    def keep_leaf(
        self,
        session_id: str,
        n_tokens: int,
        fingerprint: str | None,
        leaf: bytes | None,
        owner: str = "",
    ) -> bool:
        """Updates a session's cache key once its chunks are kept (after the reply). A
        session deleted meanwhile stays deleted: False, nothing written."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE sessions SET updated = ?, n_tokens = ?, "
                "fingerprint = COALESCE(?, fingerprint), leaf = COALESCE(?, leaf) "
                "WHERE owner = ? AND id = ?",
                (time.time(), n_tokens, fingerprint, leaf, owner, session_id),
            )
            return cur.rowcount > 0

    def _title(self, messages: tuple[Message, ...]) -> str:
        return title_of(messages) if self.keep_text else ""

    def rename(self, session_id: str, title: str, owner: str = "") -> bool:
        """A title the user chose; later turns keep it. False when unknown."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE sessions SET title = ? WHERE owner = ? AND id = ?",
                (title if self.keep_text else "", owner, session_id),
            )
        return cur.rowcount > 0

    def import_(self, rows: Sequence[SessionInfo], owner: str = "") -> tuple[bool, ...]:
        """Adds conversations kept elsewhere (the app's old database), without KV, in
        one transaction: a listing meanwhile sees all of them or none (the app showed
        half a hand-over). An id already known is left as it is, so importing twice
        changes nothing. For each row, True when it was added."""
        added = []
        with self._lock, sqlite.transaction(self._db):
            for row in rows:
                messages = row.messages if self.keep_text else ()
                title = (row.title or title_of(messages)) if self.keep_text else ""
                payload = json.dumps([_as_json(m) for m in messages])
                cur = self._db.execute(
                    "INSERT INTO sessions (id, title, created, updated, n_tokens, fingerprint,"
                    " leaf, messages, owner) VALUES (?, ?, ?, ?, 0, NULL, NULL, ?, ?)"
                    " ON CONFLICT(owner, id) DO NOTHING",
                    (row.id, title, row.created, row.updated, payload, owner),
                )
                added.append(cur.rowcount > 0)
        return tuple(added)

    def delete(self, session_id: str, owner: str = "") -> bool:
        """Deletes a session and the responses kept in it; their text leaves the
        database file (secure_delete) and the WAL (a checkpoint) before this returns."""
        with self._lock:
            cur = self._db.execute(
                "DELETE FROM sessions WHERE owner = ? AND id = ?", (owner, session_id)
            )
            self._db.execute(
                "DELETE FROM responses WHERE owner = ? AND session_id = ?", (owner, session_id)
            )
            sqlite.checkpoint(self._db)
        return cur.rowcount > 0

    def keep_response(self, response: StoredResponse, owner: str = "") -> bool:
        """Keeps a response under its id (False, nothing kept, when no conversation
        text is kept: it is all text)."""
        if not self.keep_text:
            return False
        messages = json.dumps([_as_json(m) for m in response.messages])
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses (id, session_id, named, created, messages,"
                " body, owner) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    *(response.id, response.session_id, int(response.named)),
                    *(response.created or time.time(), messages, json.dumps(response.body)),
                    owner,
                ),
            )
        return True

    def response(self, response_id: str, owner: str = "") -> StoredResponse | None:
        """``owner``'s response of this id (another user's is None, as unknown)."""
        with self._lock:
            r = self._db.execute(
                "SELECT id, session_id, named, created, messages, body FROM responses "
                "WHERE owner = ? AND id = ?",
                (owner, response_id),
            ).fetchone()
        if r is None:
            return None
        messages = tuple(_from_json(m) for m in json.loads(r[4]))
        return StoredResponse(r[0], r[1], bool(r[2]), messages, json.loads(r[5]), r[3])

    def delete_response(self, response_id: str, owner: str = "") -> bool:
        with self._lock:
            cur = self._db.execute(
                "DELETE FROM responses WHERE owner = ? AND id = ?", (owner, response_id)
            )
            sqlite.checkpoint(self._db)
        return cur.rowcount > 0

    def close(self) -> None:
        """Checkpoints (a clean shutdown leaves no WAL behind) and closes."""
        with self._lock:
            try:
                sqlite.checkpoint(self._db)
            finally:
                self._db.close()
