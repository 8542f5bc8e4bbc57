"""A real HTTP server on loopback for the app's end-to-end tests.

The command is swappable: by default the app's contract fake
(``python -m app.tools.fake_server``); ``WARMSTART_APP_TEST_SERVER=runtime`` uses the
runtime's fake (``python -m runtime.api --fake``), and ``WARMSTART_APP_TEST_SERVER_CMD``
any command with ``{port}`` in it, e.g. ``warmstart serve --port {port}``.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(port: int, state: Path, extra: list[str]) -> list[str]:
    custom = os.environ.get("WARMSTART_APP_TEST_SERVER_CMD")
    if custom:
        return [p.replace("{port}", str(port)) for p in shlex.split(custom)]
    if os.environ.get("WARMSTART_APP_TEST_SERVER") == "runtime":
        return [sys.executable, "-m", "runtime.api", "--fake", "--port", str(port)]
    fake = [sys.executable, "-m", "app.tools.fake_server", "--port", str(port)]
    return [*fake, "--state", str(state), *extra]


class ServerProcess:
    def __init__(self, port: int, state: Path, extra: list[str], log: Path) -> None:
        self.port = port
        self.state = state
        self.extra = extra
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 60.0) -> ServerProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                server_command(self.port, self.state, self.extra),
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code < 500:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not answer /health in time")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator:
    started: list[ServerProcess] = []

    def make(*extra: str) -> ServerProcess:
        server = ServerProcess(
            free_port(),
            tmp_path / f"server{len(started)}.json",
            list(extra),
            tmp_path / "server.log",
        )
        started.append(server)
        return server.start()

    yield make
    for server in started:
        server.stop()
