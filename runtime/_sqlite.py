"""SQLite with named, ordered migrations (every database warmstart writes is versioned)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from .errors import CacheError

Migration = tuple[str, str]  # (name, SQL script); never edit one that has shipped
# SQLite's primary result codes for a file that is not (or no longer) a database
_DAMAGED_CODES = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB


class Damaged(sqlite3.DatabaseError):
    """The integrity check found damage that opening the file did not."""


def connect(
    path: Path, migrations: Sequence[Migration], *, check: bool = False
) -> sqlite3.Connection:
    """Opens (creating if needed) a database and applies the migrations it lacks, in
    order. ``check``: also run SQLite's quick integrity check (it reads every page:
    for small databases)."""
    conn: sqlite3.Connection | None = None
    try:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        # deleted rows are overwritten with zeros, not left in free pages
        conn.execute("PRAGMA secure_delete=ON")
        if check:
            _quick_check(conn)
        migrate(conn, migrations)
    except sqlite3.DatabaseError as exc:
        if conn is not None:
            conn.close()  # the file may be set aside next: no handle stays open on it
        raise CacheError(f"{path}: {exc}") from exc
    for suffix in ("", "-wal", "-shm"):
        p = Path(str(path) + suffix)
        if p.exists():
            p.chmod(0o600)
    return conn


def _quick_check(conn: sqlite3.Connection) -> None:
    found = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
    if found != ["ok"]:
        # SQLite's report spans lines; the log gets one
        raise Damaged("; ".join(" ".join(str(f).split()) for f in found))


def is_damaged(exc: BaseException) -> bool:
    """Whether a failure to open a database says the file itself is damaged (not a
    database, corrupt pages), as opposed to locked, unreadable or on a full disk."""
    cause = exc.__cause__ if isinstance(exc, CacheError) else exc
    if isinstance(cause, Damaged):
        return True
    code = getattr(cause, "sqlite_errorcode", None)
    return (
        isinstance(cause, sqlite3.DatabaseError)
        and code is not None
        and code & 0xFF in _DAMAGED_CODES
    )


def set_aside(path: Path) -> Path:
    """Renames a damaged database (and its WAL, which belongs to it) out of the way,
    with the time in its name, so that a fresh one can be made and nothing is lost;
    returns the new name. Its shared-memory file is only a cache: removed."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.stem}.damaged-{stamp}{path.suffix}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.stem}.damaged-{stamp}-{n}{path.suffix}")
    path.rename(aside)
    wal = Path(f"{path}-wal")
    if wal.exists():
        wal.rename(Path(f"{aside}-wal"))
    Path(f"{path}-shm").unlink(missing_ok=True)
    return aside


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
