"""The server's optional Unix-domain socket (``unix_socket``).

A TCP port on loopback belongs to whoever binds it first: when a server dies, any
local program can take its port at once, and a client that reconnects hands it the
key and the conversation. A socket file in a folder only its owner can write cannot
be taken over that way, and its 0600 mode keeps other users from connecting at all.
The desktop app talks to the server it starts through one (see app/core/launcher.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

# sun_path holds 108 bytes on Linux and 104 on macOS, the terminating NUL included
MAX_PATH_BYTES = 103


def _check_folder(folder: Path) -> None:
    """The folder must be ours and writable by nobody else: whoever can write it can
    replace the socket file with one of their own."""
    try:
        info = folder.stat()
    except OSError as exc:
        raise ConfigError(f"unix_socket: cannot use the folder {folder}: {exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"unix_socket: {folder} is not a directory")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise ConfigError(f"unix_socket: {folder} belongs to another user (uid {info.st_uid})")
    if stat.S_IMODE(info.st_mode) & 0o022:
        raise ConfigError(
            f"unix_socket: other users can write in {folder} (mode "
            f"{stat.S_IMODE(info.st_mode):o}); choose a folder only you can write"
        )


def _clear_stale(path: Path) -> None:
    """Removes a socket file left by a server that died; refuses one still served
    (another warmstart) and anything that is not a socket."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ConfigError(f"unix_socket: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink(missing_ok=True)  # nobody listens there: a leftover
        return
    finally:
        probe.close()
    raise ConfigError(f"unix_socket: {path} is in use (another warmstart?)")


@dataclass
class UnixListener:
    """A bound socket file; :meth:`close` removes the file unless another server has
    put its own there since (a file with another inode)."""

    path: Path
    sock: socket.socket
    inode: int

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(OSError):
            if self.path.lstat().st_ino == self.inode:
                self.path.unlink()


def bind_unix(path: Path | None) -> UnixListener | None:
    """Binds the socket file (0600), not listening yet; None without ``path``.
    Raises ConfigError naming the setting when it cannot be used safely."""
    if path is None:
        return None
    family = getattr(socket, "AF_UNIX", None)
    if family is None or os.name == "nt":
        raise ConfigError("unix_socket: this system has no Unix-domain sockets; use host/port")
    size = len(os.fsencode(str(path)))
    if size > MAX_PATH_BYTES:
        raise ConfigError(
            f"unix_socket: {path} is {size} bytes long; a socket path holds at most "
            f"{MAX_PATH_BYTES}"
        )
    _check_folder(path.parent)
    _clear_stale(path)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o600)  # under any umask: connecting needs write permission
        inode = path.lstat().st_ino
    except OSError as exc:
        sock.close()
        raise ConfigError(f"unix_socket: cannot bind {path}: {exc.strerror or exc}") from exc
    return UnixListener(path, sock, inode)
