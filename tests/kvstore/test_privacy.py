"""Data at rest on the real model: every file private, deletion leaves no text behind,
history off keeps none, a symlinked or foreign cache dir is refused."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from warmstart.runtime._private import private_dir
from warmstart.runtime.errors import ConfigError
from warmstart.runtime.types import Message, Request, Sampling

SECRET = "zebra-secret-7731"


def _ask(rt: Any, session: str) -> None:
    request = Request(
        messages=(Message("user", f"my password is {SECRET}"),),
        sampling=Sampling(max_tokens=4),
        session_id=session,
    )
    rt.generate(request).text()
    assert rt.wait_idle(60)


def _holding(root: Path, text: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def _loose(root: Path) -> list[str]:
    """Every path under root (root included) that group or others may access."""
    paths = [root, *root.rglob("*")]
    return [f"{p} {stat.S_IMODE(p.lstat().st_mode):o}" for p in paths if p.lstat().st_mode & 0o077]


def test_every_file_is_private_and_deletion_leaves_no_text(
    make_runtime: Any, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    rt = make_runtime(data)
    _ask(rt, "s1")
    names = {p.name for p in data.rglob("*")}
    assert {"sessions.db-wal", "sessions.db-shm", "index.db-wal"} <= names
    assert _loose(data) == []  # the test process's umask is 022: the code sets the modes
    assert _holding(data, SECRET)  # it was there (in sessions.db or its WAL)
    assert rt.delete_session("s1")
    assert _holding(data, SECRET) == []  # while the server still runs
    rt.close()
    assert _holding(data, SECRET) == []
    assert not (data / "sessions.db-wal").exists() or (data / "sessions.db-wal").stat().st_size == 0


def test_history_off_keeps_no_text(make_runtime: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    rt = make_runtime(data, history=False)
    _ask(rt, "s2")
    assert rt.session("s2") is not None and rt.session("s2").messages == ()
    rt.close()
    assert _holding(data, SECRET) == []


def test_loose_directories_are_tightened(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    private_dir(loose, "data_dir")
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700


def test_a_symlinked_cache_dir_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    link = tmp_path / "cache"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match=r"cache_dir.*symbolic link"):
        private_dir(link, "cache_dir")
    assert stat.S_IMODE(target.stat().st_mode) == 0o755  # not re-moded


def test_a_cache_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    # seen from another uid than the directory's owner
    with pytest.raises(ConfigError, match=r"cache_dir.*belongs to another user"):
        private_dir(theirs, "cache_dir", uid=os.getuid() + 1)


def test_the_cli_creates_everything_private(tmp_path: Path) -> None:
    data = tmp_path / "fresh"
    env = {**os.environ, "WARMSTART_DATA_DIR": str(data)}
    done = subprocess.run(
        [sys.executable, "-m", "warmstart.runtime.cli", "sessions", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (data / "sessions.db").exists()
    assert _loose(data) == []


def test_the_disk_tiers_sub_directories_are_private(tmp_path: Path) -> None:
    """diskcache files a value under two levels of directories it makes itself; under
    the usual umask (022, as in this test process) they must still come out 0700."""
    import diskcache
    from warmstart.runtime.kvstore._disk import PrivateDisk

    with diskcache.Cache(str(tmp_path / "blobs"), disk=PrivateDisk, disk_min_file_size=0) as cache:
        for i in range(8):
            cache.set(f"k{i}", os.urandom(4096))
    files = [p for p in (tmp_path / "blobs").rglob("*.val")]
    assert len(files) == 8
    subdirs = {p.parent for p in files} | {p.parent.parent for p in files}
    assert {f"{stat.S_IMODE(d.stat().st_mode):o}" for d in subdirs} == {"700"}
