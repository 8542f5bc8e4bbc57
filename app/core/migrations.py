"""The conversation store's schema, as named, ordered migrations.

Append new migrations at the end; never edit or reorder one that has shipped. The
runner is the runtime's (runtime/sqlite.py): each runs once, in a transaction, and its
name is recorded in ``migrations``. A migration is SQL, or a function of the
connection and the app's secret store (for a step that moves data out of the database).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable

from ...runtime import sqlite
from .errors import StoreError
from .secret_store import SecretStore

log = logging.getLogger(__name__)
Step = str | Callable[[sqlite3.Connection, SecretStore | None], None]
TABLE = "migrations"  # where this database records them (the runtime's say schema_migrations)


def _api_key_out_of_the_database(conn: sqlite3.Connection, secrets: SecretStore | None) -> None:
    """Versions before it kept the API key as plain JSON in ``preferences``: it goes to
    the keyring (or the 0600 key file), and its bytes are overwritten in the file."""
    row = conn.execute("SELECT value FROM preferences WHERE key = 'api_key'").fetchone()
    if row is None:
        return
    try:
        key = json.loads(row[0])
    except json.JSONDecodeError:
        key = ""
    if key and secrets is not None:
        secrets.set(str(key))
    elif key:
        log.warning("the saved API key was dropped from the database: enter it again in Settings")
    # secure_delete overwrites the freed bytes; the store checkpoints the WAL afterwards.
    conn.execute("PRAGMA secure_delete = ON")
    conn.execute("DELETE FROM preferences WHERE key = 'api_key'")


MIGRATIONS: tuple[tuple[str, Step], ...] = (
    (
        "0001_conversations",
        """
        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            title TEXT NOT NULL DEFAULT '',
            created REAL NOT NULL,
            updated REAL NOT NULL
        );
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL,
            created REAL NOT NULL,
            UNIQUE (conversation_id, position)
        );
        """,
    ),
    (
        "0002_pinned",
        "ALTER TABLE conversations ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;",
    ),
    (
        "0003_message_report",
        # What the server reported for each reply, so the memory panel survives a restart.
        "ALTER TABLE messages ADD COLUMN report TEXT;",
    ),
    (
        "0004_conversation_model_and_index",
        """
        ALTER TABLE conversations ADD COLUMN model TEXT;
        CREATE INDEX conversations_updated ON conversations(pinned DESC, updated DESC);
        """,
    ),
    (
        "0005_preferences",
        "CREATE TABLE preferences (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    ),
    ("0006_api_key_out_of_the_database", _api_key_out_of_the_database),
    (
        "0007_reply_reports",
        # The cache report of each reply in a conversation the server keeps (which keeps
        # the text, not what the app showed under it), so the lines survive a restart.
        # Keyed by position; the hash of the reply says whether it is still that reply.
        # No foreign key: those conversations are not in this file.
        """
        CREATE TABLE reply_reports (
            conversation_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            content_sha256 TEXT NOT NULL,
            report TEXT NOT NULL,
            PRIMARY KEY (conversation_id, position)
        );
        """,
    ),
)


def migrate(conn: sqlite3.Connection, secrets: SecretStore | None = None) -> list[str]:
    """Apply the pending migrations in order (the runtime's runner, runtime/sqlite.py);
    returns the names applied now."""
    steps = [(name, _given(step, secrets)) for name, step in MIGRATIONS]
    try:
        return sqlite.migrate(conn, steps, table=TABLE)
    except sqlite3.Error as exc:
        raise StoreError(f"the app's database: {exc}") from exc


def _given(step: Step, secrets: SecretStore | None) -> sqlite.Step:
    """The runner's step: SQL as it is, a function with the secret store given."""
    if isinstance(step, str):
        return step
    return lambda conn: step(conn, secrets)


def applied(conn: sqlite3.Connection) -> list[str]:
    return sqlite.applied(conn, TABLE)
