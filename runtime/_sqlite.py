"""SQLite with named, ordered migrations (every database warmstart writes is versioned)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from .errors import CacheError

Migration = tuple[str, str]  # (name, SQL script); never edit one that has shipped


def connect(path: Path, migrations: Sequence[Migration]) -> sqlite3.Connection:
    """Opens (creating if needed) a database and applies the migrations it lacks, in order."""
    try:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        # deleted rows are overwritten with zeros, not left in free pages
        conn.execute("PRAGMA secure_delete=ON")
        migrate(conn, migrations)
    except sqlite3.DatabaseError as exc:
        raise CacheError(f"{path}: {exc}") from exc
    for suffix in ("", "-wal", "-shm"):
        p = Path(str(path) + suffix)
        if p.exists():
            p.chmod(0o600)
    return conn


def checkpoint(conn: sqlite3.Connection) -> None:
    """Folds the WAL into the database and empties it: what was deleted is then gone
    from the WAL file too (with secure_delete, from the database's pages as well)."""
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.DatabaseError as exc:  # busy readers: the next checkpoint gets it
        raise CacheError(f"checkpoint failed: {exc}") from exc


def migrate(conn: sqlite3.Connection, migrations: Sequence[Migration]) -> list[str]:
    """Applies pending migrations; returns the names applied now."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied REAL)"
    )
    done = {row[0] for row in conn.execute("SELECT name FROM schema_migrations")}
    applied = []
    for name, script in migrations:
        if name in done:
            continue
        conn.execute("BEGIN")
        try:
            for statement in filter(None, (s.strip() for s in script.split(";"))):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations (name, applied) VALUES (?, ?)", (name, time.time())
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        applied.append(name)
    return applied
