"""Starting a local ``warmstart serve`` when nothing answers at a loopback base URL."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from .errors import AppError, ServerBusy, ServerUnavailable
from .types import Health

log = logging.getLogger(__name__)
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


def is_loopback(base_url: str) -> bool:
    return (urlsplit(base_url).hostname or "") in LOOPBACK_HOSTS


def port_of(base_url: str) -> int:
    parts = urlsplit(base_url)
    return parts.port or (443 if parts.scheme == "https" else 80)


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


class LocalServer:
    """A server process this app started, and stops when it quits."""

    def __init__(
        self, command: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.command = list(command)
        # The server's output goes to a file: a pipe nobody drains would block it.
        self.log_path = log_path
        self._env = {**os.environ, **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log.info("starting a local server: %s", " ".join(self.command))
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as out:
                self._proc = subprocess.Popen(
                    self.command,
                    env=self._env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
        except OSError as exc:
            raise AppError(f"could not start {self.command[0]}: {exc}") from exc

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

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
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            # A server stuck in a long prefill may ignore SIGTERM for a while.
            proc.kill()
            proc.wait(grace)
