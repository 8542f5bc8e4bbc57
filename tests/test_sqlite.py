"""The one migration runner (runtime/sqlite.py) that the runtime's databases and the
app's share: steps of SQL or Python, each in a transaction, and a newer version's
database refused with a clear error and left as it was."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from warmstart.app.core.migrations import migrate as app_migrate
from warmstart.runtime import sqlite
from warmstart.runtime.errors import CacheError, DiskUnavailable
from warmstart.runtime.kvstore._disk import DiskTier
from warmstart.runtime.serving._sessions import SessionBook


def _conn(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def test_sql_is_parsed_by_sqlite_not_split_on_semicolons(tmp_path: Path) -> None:
    conn = _conn(tmp_path / "a.db")
    steps: list[sqlite.Migration] = [
        ("0001_notes", "CREATE TABLE notes (text TEXT); INSERT INTO notes VALUES ('a; b')"),
    ]
    assert sqlite.migrate(conn, steps) == ["0001_notes"]
    assert conn.execute("SELECT text FROM notes").fetchall() == [("a; b",)]
    assert sqlite.migrate(conn, steps) == []


def test_a_failed_step_leaves_nothing_and_says_which(tmp_path: Path) -> None:
    conn = _conn(tmp_path / "a.db")

    def half_done(c: sqlite3.Connection) -> None:
        c.execute("CREATE TABLE half (x)")
        c.execute("INSERT INTO nowhere VALUES (1)")

    steps: list[sqlite.Migration] = [("0001_ok", "CREATE TABLE ok (x)"), ("0002_half", half_done)]
    with pytest.raises(sqlite.MigrationError, match="0002_half"):
        sqlite.migrate(conn, steps)
    assert sqlite.applied(conn) == ["0001_ok"]
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "half" not in tables and "ok" in tables


def test_a_newer_versions_database_is_refused(tmp_path: Path) -> None:
    conn = _conn(tmp_path / "a.db")
    sqlite.migrate(conn, [("0001_ok", "CREATE TABLE ok (x)")])
    conn.execute("INSERT INTO schema_migrations VALUES ('9999_later', 0)")
    with pytest.raises(sqlite.MigrationError, match="newer version"):
        sqlite.migrate(conn, [("0001_ok", "CREATE TABLE ok (x)")])


def _from_the_future(path: Path, table: str = "schema_migrations") -> bytes:
    conn = _conn(path)
    conn.execute(f"INSERT INTO {table} VALUES ('9999_later', 0)")
    conn.close()
    return path.read_bytes()


def test_sessions_from_a_newer_version_are_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    SessionBook(path).close()
    before = _from_the_future(path)
    with pytest.raises(CacheError, match="newer version"):
        SessionBook(path)
    assert path.read_bytes() == before  # not set aside as damaged, not emptied
    assert not list(tmp_path.glob("*damaged*"))


def test_a_newer_versions_cache_index_leaves_the_disk_tier_off(tmp_path: Path) -> None:
    DiskTier(tmp_path, "fp", 1, 1 << 20).close()
    before = _from_the_future(tmp_path / "index.db")
    with pytest.raises(DiskUnavailable, match="newer version"):
        DiskTier(tmp_path, "fp", 1, 1 << 20)  # the runtime then runs from RAM
    assert (tmp_path / "index.db").read_bytes() == before


def test_the_app_runs_the_same_runner_into_its_own_table(tmp_path: Path) -> None:
    conn = _conn(tmp_path / "app.db")
    names = app_migrate(conn)
    assert names and sqlite.applied(conn, "migrations") == sorted(names)


def test_a_transaction_keeps_all_of_its_writes_or_none(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    conn.execute("CREATE TABLE t (x INTEGER)")
    with pytest.raises(RuntimeError), sqlite.transaction(conn):
        conn.execute("INSERT INTO t VALUES (1)")
        raise RuntimeError("half way")
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,) and not conn.in_transaction
    with sqlite.transaction(conn):
        conn.executemany("INSERT INTO t VALUES (?)", [(1,), (2,)])
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (2,)
    conn.close()
