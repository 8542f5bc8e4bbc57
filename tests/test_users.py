"""The keys file (runtime/users.py) and `warmstart keys`: keys stored as salted hashes,
shown once, read again when the file changes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from warmstart.runtime.cli import main
from warmstart.runtime.errors import ConfigError
from warmstart.runtime.users import (
    LOCAL,
    KeyBook,
    add_user,
    find_user,
    read_users,
    remove_user,
)


def test_a_key_is_kept_as_a_salted_hash_only(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    key = add_user(path, "alice")
    raw = path.read_text()
    assert key not in raw and key[4:] not in raw
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    users = read_users(path)
    assert find_user(users, key) == users[0]
    assert find_user(users, key + "x") is None and find_user(users, "") is None


def test_users_get_their_own_scopes_and_a_group_shares_the_cache(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    add_user(path, "alice")
    add_user(path, "bob")
    add_user(path, "carol", cache_group="family")
    add_user(path, "dave", cache_group="family")
    a, b, c, d = (u.caller() for u in read_users(path))
    assert len({a.owner, b.owner, c.owner, d.owner, LOCAL.owner}) == 5  # conversations apart
    assert len({a.cache_scope, b.cache_scope, c.cache_scope, LOCAL.cache_scope}) == 4
    assert c.cache_scope == d.cache_scope  # the group's cache, opted into


def test_the_same_name_again_is_refused_and_removed_users_start_anew(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    first = add_user(path, "alice")
    scope = read_users(path)[0].caller().cache_scope
    with pytest.raises(ConfigError, match="already has a key"):
        add_user(path, "alice")
    assert remove_user(path, "alice") and not remove_user(path, "alice")
    second = add_user(path, "alice")
    assert find_user(read_users(path), first) is None
    assert read_users(path)[0].caller().cache_scope != scope  # the old cache is not theirs
    assert find_user(read_users(path), second) is not None


@pytest.mark.parametrize("name", ["", "1abc", "a b", "a/b", "x" * 33])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="user name"):
        add_user(tmp_path / "keys.json", name)


def test_a_damaged_or_unknown_file_is_an_error_not_no_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not a warmstart keys file"):
        read_users(path)
    path.write_text(json.dumps({"format": 99, "users": []}))
    with pytest.raises(ConfigError, match="format 99"):
        read_users(path)


def test_the_book_reads_the_file_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    book = KeyBook(path)
    assert book.current() == ()
    key = add_user(path, "alice")
    assert find_user(book.current(), key) is not None
    path.write_text("{damaged")
    assert find_user(book.current(), key) is not None  # the users read last stay
    os.unlink(path)
    assert book.current() == ()


def test_keys_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = ["--data-dir", str(tmp_path)]
    assert main(["keys", "add", "alice", *where]) == 0
    shown = capsys.readouterr().out
    key = next(w for w in shown.split() if w.startswith("wsk-"))
    assert find_user(read_users(tmp_path / "keys.json"), key) is not None
    assert main(["keys", "add", "bob", "--cache-group", "family", *where]) == 0
    capsys.readouterr()
    assert main(["keys", "list", *where]) == 0
    listed = capsys.readouterr().out
    assert "alice" in listed and "bob" in listed and "family" in listed and "wsk-" not in listed
    assert main(["keys", "remove", "alice", *where]) == 0
    assert main(["keys", "remove", "alice", *where]) == 1
    assert [u.name for u in read_users(tmp_path / "keys.json")] == ["bob"]
