"""What the runtime finds on disk at start, without a model: loose modes are tightened
everywhere in the data dir, a damaged sessions.db is set aside for a fresh one, and
the rule that makes session ids safe names."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from warmstart.runtime import sqlite
from warmstart.runtime._private import private_tree
from warmstart.runtime.errors import CacheError, RequestError
from warmstart.runtime.serving._sessions import (
    MAX_SESSION_ID,
    SessionBook,
    check_session_id,
    session_id_problem,
)
from warmstart.runtime.types import Message


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# -- modes --------------------------------------------------------------------------------


def test_every_loose_file_and_folder_warmstart_keeps_is_tightened(tmp_path: Path) -> None:
    from warmstart.runtime.serving._factory import DATA_ENTRIES

    data = tmp_path / "data"
    chunk = data / "cache" / "blobs" / "ab" / "cd" / "0123.val"
    chunk.parent.mkdir(parents=True)
    files = [chunk, data / "cache" / "index.db", data / "sessions.db", data / "sessions.db-wal"]
    files += [data / "calibration.json", data / "digests.json", data / "extra_buffers.json"]
    for path in files:
        path.write_text("{}")
        path.chmod(0o644)
    tool = data / "models" / "helper.sh"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    folders = [data / "cache", data / "cache" / "blobs", chunk.parent.parent, chunk.parent]
    folders += [tool.parent]
    for folder in folders:
        folder.chmod(0o755)
    mine = data / "notes.txt"  # not warmstart's: a data dir pointed at a folder in use
    mine.write_text("mine")
    mine.chmod(0o644)
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("not ours to change")
    outside.chmod(0o644)
    (data / "link.json").symlink_to(outside)

    assert private_tree(data, DATA_ENTRIES) == len(files) + 1 + len(folders)
    assert all(mode(p) == 0o600 for p in files)
    assert mode(tool) == 0o700  # its owner keeps what it had
    assert all(mode(p) == 0o700 for p in folders)
    assert mode(mine) == 0o644 and mode(outside) == 0o644  # a symlink is not followed
    assert private_tree(data, DATA_ENTRIES) == 0  # nothing left to do
    assert private_tree(tmp_path / "absent") == 0


@pytest.mark.usefixtures("clean_settings")
def test_opening_a_runtime_tightens_its_directories_first(tmp_path: Path) -> None:
    from warmstart.runtime.errors import ModelError
    from warmstart.runtime.serving import _factory as factory
    from warmstart.runtime.settings import load_settings

    data, cache = tmp_path / "data", tmp_path / "cache"
    loose = [data / "calibration.json", cache / "index.db", cache / "blobs" / "x.val"]
    for path in loose:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
        path.chmod(0o644)
    settings = load_settings(data_dir=data, cache_dir=cache, model=str(tmp_path / "no.gguf"))
    with pytest.raises(ModelError):
        factory.open_runtime(settings)  # fails at the model, after the tightening
    assert [mode(p) for p in loose] == [0o600] * 3


# -- a damaged sessions.db ------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [b"this is not a database at all" * 100, b"SQLite format 3\x00" + b"\xff" * 8000],
    ids=["not-a-database", "corrupt-header"],
)
def test_a_damaged_sessions_db_is_set_aside_and_a_fresh_one_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: bytes
) -> None:
    path = tmp_path / "sessions.db"
    path.write_bytes(damage)
    with caplog.at_level(logging.ERROR, "warmstart.runtime.sessions"):
        book = SessionBook(path)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("sessions.damaged-")]
    names = [p.name for p in aside]
    assert len(names) == 1 and names[0].endswith(".db")
    assert (tmp_path / names[0]).read_bytes() == damage  # kept as it was, for recovery
    assert "damaged" in caplog.text and names[0] in caplog.text
    book.save("s1", (Message("user", "hello"),), 3, None, None)
    assert [r.id for r in book.list()] == ["s1"]
    book.close()
    again = SessionBook(path)  # the fresh one is a good database: nothing set aside now
    assert [r.id for r in again.list()] == ["s1"]
    again.close()
    assert [p for p in tmp_path.iterdir() if p.name.startswith("sessions.damaged-")] == aside


def test_damaged_pages_that_opening_does_not_notice_are_found_by_the_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "sessions.db"
    book = SessionBook(path)
    for i in range(300):
        book.save(f"s{i}", (Message("user", "x" * 500),), 3, None, None)
    book.close()
    data = bytearray(path.read_bytes())
    data[3 * 4096 : 3 * 4096 + 200] = b"\xab" * 200  # a b-tree page; the header is fine
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, "warmstart.runtime.sessions"):
        fresh = SessionBook(path)
    assert fresh.list() == []
    fresh.close()
    assert "is damaged" in caplog.text and "\n" not in caplog.records[0].getMessage()
    assert len(list(tmp_path.glob("sessions.damaged-*.db"))) == 1


def test_a_database_that_cannot_be_opened_is_not_taken_for_damaged(tmp_path: Path) -> None:
    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode = 5  # type: ignore[attr-defined]
    assert not sqlite.is_damaged(CacheError("x"))
    wrapped = CacheError("sessions.db: database is locked")
    wrapped.__cause__ = locked
    assert not sqlite.is_damaged(wrapped)
    if hasattr(os, "getuid") and os.getuid() == 0:
        pytest.skip("root reads any file")
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "sessions.db").write_bytes(b"")
    (folder / "sessions.db").chmod(0)
    with pytest.raises(CacheError):
        SessionBook(folder / "sessions.db")
    assert sorted(p.name for p in folder.iterdir()) == ["sessions.db"]  # nothing moved


# -- session ids ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["a/b", "/etc/passwd", "../x/y", "..", "x..y", "a\\b", "a\nb", "a\x00", "\x7f", "a\u2028b"],
)
def test_unsafe_session_ids_are_refused_with_the_rule(value: str) -> None:
    assert session_id_problem(value) is not None
    with pytest.raises(RequestError, match="session id is a name of") as caught:
        check_session_id(value, "user")
    assert caught.value.param == "user"


def test_ordinary_ids_pass_and_length_is_bounded() -> None:
    for value in ("alice@example.com", "c1a2b3", "my chat", "café", "a.b", "x" * MAX_SESSION_ID):
        assert session_id_problem(value) is None, value
    assert session_id_problem("") is not None
    assert "characters long" in (session_id_problem("x" * (MAX_SESSION_ID + 1)) or "")
