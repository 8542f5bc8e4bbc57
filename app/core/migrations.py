"""The conversation store's schema, as named, ordered migrations.

Append new migrations at the end; never edit or reorder one that has shipped. Each
runs once, in a transaction, and its name is recorded in ``migrations``.
"""

from __future__ import annotations

import sqlite3
import time

from .errors import StoreError

MIGRATIONS: tuple[tuple[str, str], ...] = (
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
)


def applied(conn: sqlite3.Connection) -> list[str]:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied REAL NOT NULL)"
    )
    return [row[0] for row in conn.execute("SELECT name FROM migrations ORDER BY name")]


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply the pending migrations in order; returns the names applied now."""
    done = set(applied(conn))
    known = [name for name, _ in MIGRATIONS]
    unknown = done - set(known)
    if unknown:
        # A newer app wrote this database; running older code on it could corrupt it.
        raise StoreError(f"database has migrations this app does not know: {sorted(unknown)}")
    now_applied = []
    for name, sql in MIGRATIONS:
        if name in done:
            continue
        # executescript commits first, so wrap each migration in its own explicit transaction
        try:
            record = f"INSERT INTO migrations VALUES ('{name}', {time.time()!r});"
            conn.executescript(f"BEGIN;\n{sql}\n{record}\nCOMMIT;")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise StoreError(f"migration {name} failed: {exc}") from exc
        now_applied.append(name)
    return now_applied
