"""SQLite with named, ordered migrations: every database warmstart writes, the
runtime's (sessions.db, the disk tier's index.db) and the desktop app's, is versioned
by this one runner.

A migration is a name and a step: SQL, or a function of the connection (for a step
that moves data). Each runs once, in a transaction, and its name is recorded. Append
new ones at the end; never edit or reorder one that has shipped. A database that
lists a migration this code does not know was written by a newer version: it is
refused (MigrationError), since running older code on it could damage it.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .errors import CacheError

Step = str | Callable[[sqlite3.Connection], None]
Migration = tuple[str, Step]  # (name, step); never edit one that has shipped
# SQLite's primary result codes for a file that is not (or no longer) a database
_DAMAGED_CODES = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB


class Damaged(sqlite3.DatabaseError):
    """The integrity check found damage that opening the file did not."""


class MigrationError(sqlite3.DatabaseError):
    """A migration failed (and was rolled back), or the database is a newer version's."""


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
    if isinstance(cause, MigrationError) and cause.__cause__ is not None:
        cause = cause.__cause__  # a migration that met a damaged page
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


def applied(conn: sqlite3.Connection, table: str = "schema_migrations") -> list[str]:
    """The names of the migrations a database has had, in order of name."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (name TEXT PRIMARY KEY, applied REAL)")
    return [row[0] for row in conn.execute(f"SELECT name FROM {table} ORDER BY name")]


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """What the block writes on ``conn`` (opened in autocommit) is committed together,
    or rolled back together when it raises: a reader meanwhile sees all of it or none."""
    conn.execute("BEGIN")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def migrate(
    conn: sqlite3.Connection, migrations: Sequence[Migration], table: str = "schema_migrations"
) -> list[str]:
    """Applies the pending migrations in order; returns the names applied now.
    ``table``: where the names are recorded (the app's database calls it migrations)."""
    done = set(applied(conn, table))
    unknown = done - {name for name, _ in migrations}
    if unknown:
        raise MigrationError(f"written by a newer version: it has migrations {sorted(unknown)}")
    now = []
    for name, step in migrations:
        if name in done:
            continue
        try:
            if isinstance(step, str):
                # executescript commits what is pending first, then runs the script as
                # SQLite parses it (a ';' inside a string or a trigger is no statement's end)
                conn.executescript(f"BEGIN;\n{step}\n;")
            else:
                conn.execute("BEGIN")
                step(conn)
            conn.execute(f"INSERT INTO {table} (name, applied) VALUES (?, ?)", (name, time.time()))
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise MigrationError(f"migration {name} failed: {exc}") from exc
            raise
        now.append(name)
    return now
