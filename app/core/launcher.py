"""Starting a local ``warmstart serve`` when nothing answers at a loopback base URL.

The server gets a fresh random key through a 0600 file (``WARMSTART_API_KEY_FILE``),
never on its command line, where every local user could read it in ``ps``. Its
output goes through a pipe into a rotated log, so a chatty server cannot fill the
disk.

Where the system has Unix-domain sockets, the server also listens on one in the
app's 0700 data folder (``WARMSTART_UNIX_SOCKET``) and the app talks to it only
there: a loopback port is anyone's once the server dies, that folder is not, so no
other program can receive the key or a message in its place. On Windows the app
uses the port, and checks before every request with the key that the process it
started is the one listening (see ``LocalServer.check_listening``).
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import psutil

from .errors import AppError, ServerBusy, ServerUnavailable, UntrustedServer
from .private import private_file, write_private
from .types import Health

log = logging.getLogger(__name__)
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
KEY_FILE = "server-key"
LOG_BYTES = 1 << 20  # per file; the log and two old ones stay under 3 MiB
LOG_BACKUPS = 2
SOCKET_FILE = "server.sock"
# sun_path holds 104 bytes on macOS (108 on Linux), the terminating NUL included
MAX_SOCKET_PATH = 103


def new_key() -> str:
    """A fresh key for one run of the local server (256 bits, no whitespace)."""
    return secrets.token_urlsafe(32)


def is_loopback(base_url: str) -> bool:
    return (urlsplit(base_url).hostname or "") in LOOPBACK_HOSTS


def port_of(base_url: str) -> int:
    parts = urlsplit(base_url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def socket_path_for(data_dir: Path) -> Path | None:
    """Where the app's own server listens besides its port: in the app's data folder,
    or in a fresh private temporary folder when that path is too long for a socket.
    None where the system has no Unix-domain sockets (Windows)."""
    if getattr(socket, "AF_UNIX", None) is None or os.name == "nt":
        return None
    path = data_dir / SOCKET_FILE
    if len(os.fsencode(str(path))) <= MAX_SOCKET_PATH:
        return path
    # mkdtemp: a new name, made 0700 and ours, so nobody else can have put a file there
    return Path(tempfile.mkdtemp(prefix="warmstart-")) / SOCKET_FILE


def serve_command(port: int, override: Sequence[str] | None = None) -> list[str]:
    """``warmstart serve --port N``; the console script when installed, else the module.

    ``override`` (``WARMSTART_APP_SERVER_CMD`` in the environment, split by the caller)
    replaces it entirely, with ``{port}`` substituted: tests run a fake server this way.
    """
    if override:
        return [part.replace("{port}", str(port)) for part in override]
    script = shutil.which("warmstart") or shutil.which(
        "warmstart", path=str(Path(sys.executable).parent)
    )
    if script:
        return [script, "serve", "--port", str(port)]
    return [sys.executable, "-m", "warmstart.runtime.cli", "serve", "--port", str(port)]


def override_env(overrides: Mapping[str, object]) -> dict[str, str]:
    """Threshold overrides as the server's settings schema reads them (``WARMSTART_<NAME>``)."""
    return {f"WARMSTART_{k.upper()}": str(v) for k, v in overrides.items() if v not in (None, "")}


class _PrivateRotatingHandler(logging.handlers.RotatingFileHandler):
    """Rotates like its base, and every file it opens is 0600 from creation."""

    def _open(self) -> Any:
        path = Path(self.baseFilename)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        private_file(path)  # one left looser by an older version
        return open(fd, "a", encoding="utf-8", errors="replace")


def _copy_output(stream: IO[bytes], handler: logging.Handler) -> None:
    """Drains the server's output into the log (a pipe nobody drains would block it)."""
    with stream:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            handler.emit(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))
    handler.close()


def _connections(process: psutil.Process) -> list[Any]:
    # net_connections() since psutil 6; connections() before it.
    method = getattr(process, "net_connections", None) or process.connections
    return list(method(kind="inet"))


class LocalServer:
    """A server process this app started, and stops when it quits.

    With ``api_key`` the server is given that key through ``key_path`` (0600), which is
    removed once the server has read it (see :meth:`forget_key_file`). With
    ``socket_path`` it also listens on that Unix-domain socket."""

    def __init__(
        self,
        command: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        *,
        api_key: str | None = None,
        key_path: Path | None = None,
        socket_path: Path | None = None,
    ) -> None:
        self.command = list(command)
        self.socket_path = socket_path
        self.log_path = log_path
        self._env = {**os.environ, **(env or {})}
        self._api_key = api_key
        self.key_path = key_path or log_path.with_name(KEY_FILE)
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def _server_env(self) -> dict[str, str]:
        env = dict(self._env)
        if self.socket_path is not None:
            env["WARMSTART_UNIX_SOCKET"] = str(self.socket_path)
        else:
            env.pop("WARMSTART_UNIX_SOCKET", None)
        if self._api_key is None:
            return env
        # A key in the environment would win over the file: the server must get ours.
        env.pop("WARMSTART_API_KEY", None)
        write_private(self.key_path, self._api_key + "\n")
        env["WARMSTART_API_KEY_FILE"] = str(self.key_path)
        return env

    def start(self) -> None:
        log.info("starting a local server: %s", " ".join(self.command))
        handler = _PrivateRotatingHandler(
            self.log_path, maxBytes=LOG_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8"
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
        try:
            self._proc = subprocess.Popen(
                self.command,
                env=self._server_env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        except OSError as exc:
            handler.close()
            self.forget_key_file()
            raise AppError(f"could not start {self.command[0]}: {exc}") from exc
        assert self._proc.stdout is not None
        self._reader = threading.Thread(
            target=_copy_output, args=(self._proc.stdout, handler), daemon=True
        )
        self._reader.start()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def forget_key_file(self) -> None:
        """The server reads its key file once, at start: afterwards the key lives only
        in the two processes' memory."""
        self.key_path.unlink(missing_ok=True)

    def check_listening(self, port: int) -> None:
        """Raises :class:`UntrustedServer` unless this server (or a process it started)
        is the one listening on ``port``: another process may have taken the port
        before ours could, and must not be sent the key."""
        url = f"port {port}"
        if not self.running or self._proc is None:
            raise UntrustedServer(url, "the server the app started is not running")
        try:
            me = psutil.Process(self._proc.pid)
            family = [me, *me.children(recursive=True)]
            ports = {
                c.laddr.port
                for p in family
                for c in _connections(p)
                if c.status == psutil.CONN_LISTEN and c.laddr
            }
        except (psutil.AccessDenied, psutil.ZombieProcess) as exc:
            # Some systems hide even our own child's sockets; the 401/200 check remains.
            log.debug("cannot see the local server's sockets: %s", exc)
            return
        except psutil.NoSuchProcess as exc:
            raise UntrustedServer(url, "the server the app started has exited") from exc
        if port not in ports:
            raise UntrustedServer(url, "another process is listening there, not the app's server")

    def wait_ready(
        self,
        health: Callable[[], Health],
        *,
        timeout: float = 300.0,
        progress: Callable[[str, float | None], None] = lambda _m, _p: None,
        interval: float = 0.25,
    ) -> Health:
        """Poll ``health`` until it says ok. Loading a model takes seconds to minutes."""
        deadline = time.monotonic() + timeout
        started = time.monotonic()
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                if self._reader is not None:
                    self._reader.join(2.0)  # its last lines, for the message
                raise AppError(f"the local server exited: {self._log_tail() or 'no output'}")
            try:
                h = health()
                if h.ready:
                    return h
                progress(f"loading {h.model or 'the model'}…", h.progress)
            except (ServerUnavailable, ServerBusy):
                waited = time.monotonic() - started
                progress(f"starting the local server ({waited:.0f} s)…", None)
            if time.monotonic() > deadline:
                raise AppError(f"the local server did not become ready in {timeout:.0f} s")
            time.sleep(interval)

    def _log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text("utf-8", "replace")
        except OSError:
            return ""
        return " ".join(text.strip().splitlines()[-lines:])

    def stop(self, grace: float = 5.0) -> None:
        self.forget_key_file()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                # A server stuck in a long prefill may ignore SIGTERM for a while.
                proc.kill()
                proc.wait(grace)
        self._remove_socket()

    def _remove_socket(self) -> None:
        """The file of a server that was killed stays behind; a temporary folder made
        for it goes too."""
        path = self.socket_path
        if path is None or self.running:
            return
        path.unlink(missing_ok=True)
        if path.parent.name.startswith("warmstart-") and path.parent != self.log_path.parent:
            with contextlib.suppress(OSError):
                path.parent.rmdir()
