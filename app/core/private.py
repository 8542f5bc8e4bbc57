"""Private files: the app's data holds the user's conversations and keys.

Directories are 0700 and files 0600 from creation (``main`` sets the umask to 077;
code here does not rely on it, since tests and embedders build the app without
``main``), and ones found with looser modes are tightened.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077


def restrict_umask() -> int:
    """Every file and directory created from now on is the user's alone; returns the
    previous umask."""
    return os.umask(PRIVATE_UMASK)


def private_dir(path: Path) -> Path:
    """Creates ``path`` with mode 0700, or tightens the directory already there."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        path.chmod(0o700)
    return path


def private_dir_files(path: Path) -> Path:
    """:func:`private_dir`, and every file in it tightened to 0600 (what an older
    version left readable: logs, window state, databases)."""
    private_dir(path)
    for child in path.iterdir():
        if child.is_file() and not child.is_symlink():
            private_file(child)
    return path


def private_file(path: Path, *, create: bool = False) -> Path:
    """Tightens ``path`` to 0600; with ``create``, makes it (empty, 0600) when missing.

    Creating it first is what keeps files made later by others private: SQLite gives
    its -wal and -shm files the database file's mode, and Qt's QSaveFile keeps the
    mode of the file it replaces."""
    if create:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        os.close(fd)
    try:
        if stat.S_IMODE(path.lstat().st_mode) & 0o077:
            path.chmod(0o600)
    except FileNotFoundError:
        pass
    return path


def write_private(path: Path, text: str) -> Path:
    """Writes ``text`` to a file that is 0600 before the first byte lands in it.

    An existing file (or a symlink someone planted there) is removed first, so the
    text never goes through a file or link that another user prepared."""
    path.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    return path
