"""Private files: what warmstart writes holds the user's conversations.

Directories are 0700 and files 0600 from creation (the CLI and the app set the
umask to 077 at start; code that may run under another umask chmods what it
creates), and existing ones with looser modes are tightened: at start, everything
under the data and cache directories (:func:`private_tree`). A directory given as
a symlink, or owned by another user, is refused: following it would re-mode (or
fill) a directory someone else chose.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path

from .errors import ConfigError

PRIVATE_UMASK = 0o077


def restrict_umask() -> int:
    """Sets the process umask so that every file and directory is created private;
    returns the previous one."""
    return os.umask(PRIVATE_UMASK)


def private_dir(path: Path, setting: str, *, uid: int | None = None) -> Path:
    """Creates ``path`` (mode 0700) or checks and tightens the one there.

    Raises ConfigError naming ``setting`` when it is a symlink, not a directory, or
    owned by someone else."""
    if path.is_symlink():
        raise ConfigError(
            f"{setting}: {path} is a symbolic link; give the real directory "
            f"({path.resolve()}) if it is yours"
        )
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{setting}: {path} is not a directory")
    owner = uid if uid is not None else os.getuid() if hasattr(os, "getuid") else None
    if owner is not None and info.st_uid != owner:
        raise ConfigError(f"{setting}: {path} belongs to another user (uid {info.st_uid})")
    if stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(0o700)
    return path


def private_file(path: Path) -> None:
    """Tightens an existing file to 0600 (a no-op when it is missing)."""
    try:
        if stat.S_IMODE(path.lstat().st_mode) & 0o077:
            path.chmod(0o600)
    except FileNotFoundError:
        pass


def private_tree(root: Path, entries: tuple[str, ...] = ("*",)) -> int:
    """Tightens the entries of ``root`` whose names match ``entries`` (glob patterns),
    and everything under them, to owner-only: directories to 0700, files to their
    owner's bits (0600 for data). Earlier versions, a copy or another umask may have
    left chunk files, calibration.json or digests.json readable by others. Only the
    entries named are touched, so a data dir someone pointed at a folder of their own
    keeps the rest as it was. Symlinks are neither followed nor changed; entries of
    other users are left alone (chmod would fail anyway). Returns how many changed."""
    if root.is_symlink() or not root.is_dir():
        return 0
    changed = 0
    for entry in root.iterdir():
        if any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in entries):
            changed += _tighten_all(entry)
    return changed


def _tighten_all(top: Path) -> int:
    if top.is_symlink() or not top.is_dir():
        return _tighten(top, None)
    changed = 0
    for folder, dirs, files in os.walk(top):
        base = Path(folder)
        changed += _tighten(base, 0o700)
        for name in files:
            changed += _tighten(base / name, None)
        dirs[:] = [d for d in dirs if not (base / d).is_symlink()]
    return changed


def _tighten(path: Path, mode: int | None) -> int:
    try:
        info = path.lstat()
        loose = stat.S_IMODE(info.st_mode)
        if stat.S_ISLNK(info.st_mode) or not loose & 0o077:
            return 0
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            return 0
        path.chmod(mode if mode is not None else loose & 0o700)
    except OSError:  # gone meanwhile, or not ours to change: nothing to tighten here
        return 0
    return 1
