"""Real HTTP servers on loopback for the app's end-to-end tests.

- ``real_server``: ``warmstart serve`` on the real default model (the acceptance tests).
  One process serves the whole run, on a data dir with the run's calibration record;
  each start loads the model (~5 s). Conversation ids are fresh UUIDs,
  so the tests do not see each other's conversations; a test that needs an empty
  cache cannot have one. ``server.restart()`` keeps the data dir: the RAM pool and
  the live context are gone, the disk tier is not. ``WARMSTART_APP_TEST_SERVER_CMD``
  (with ``{port}`` and ``{data_dir}``) replaces the command, e.g. to try another model.
- ``fake_server``: the runtime's own fake (``python -m warmstart.runtime.api --fake``), for the
  tests about the app's behaviour rather than the model's.
- ``plain_server``: an OpenAI-compatible server without warmstart's extensions
  (``tests/app/plain_server.py``).
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import seed_calibration

ROOT = Path(__file__).resolve().parents[2]
# Small enough to keep a reply quick on two CPU cores, big enough that a
# conversation's prompt spans a few chunks (restores are per chunk).
REAL_SETTINGS = [
    *("--n-ctx", "2048", "--resident-sequences", "2", "--chunk-tokens", "32"),
    *("--ram-pool-bytes", "268435456", "--prewarm-sessions", "0"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """One server command on one port; ``stop()`` then ``start()`` restarts it."""

    def __init__(self, command: Callable[[int], list[str]], log: Path) -> None:
        self.port = free_port()
        self.command = command(self.port)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # a give-up bound, not a measurement: a real server on a fresh data dir calibrates
    # before it answers (WARMSTART_CALIBRATE_FIRST), which took over 120 s at load 7
    def start(self, timeout: float = 600.0) -> ServerProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
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
        raise RuntimeError(f"server did not answer /health in time: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: the real server flushes its disk tier
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self) -> ServerProcess:
        self.stop()
        return self.start()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[[Callable[[int], list[str]]], ServerProcess]]:
    """``servers(command)`` starts ``command(port)``; all are stopped after the test."""
    started: list[ServerProcess] = []

    def start(command: Callable[[int], list[str]]) -> ServerProcess:
        server = ServerProcess(command, tmp_path / "server.log")
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def shared_real_server(
    tmp_path_factory: pytest.TempPathFactory, model_path: Path, calibration: Path
) -> Iterator[ServerProcess]:
    """One ``warmstart serve`` process for the whole run, started on first use, on a
    data dir with the run's calibration (tests/conftest.py)."""
    data_dir = tmp_path_factory.mktemp("warmstart-data")
    seed_calibration(calibration, data_dir)

    def command(port: int) -> list[str]:
        custom = os.environ.get("WARMSTART_APP_TEST_SERVER_CMD")
        if custom:
            fill = {"{port}": str(port), "{data_dir}": str(data_dir)}
            parts = shlex.split(custom)
            for key, value in fill.items():
                parts = [p.replace(key, value) for p in parts]
            return parts
        serve = [sys.executable, "-m", "warmstart.runtime.cli", "serve", "--port", str(port)]
        return [*serve, "--data-dir", str(data_dir), "--model", str(model_path), *REAL_SETTINGS]

    server = ServerProcess(command, tmp_path_factory.mktemp("warmstart-log") / "server.log")
    yield server
    server.stop()


@pytest.fixture
def real_server(shared_real_server: ServerProcess) -> ServerProcess:
    """``warmstart serve`` on the default model, running; see the module docstring."""
    if not shared_real_server.running:  # first use, or a test stopped it and failed
        shared_real_server.start()
    return shared_real_server


@pytest.fixture
def fake_server(servers) -> Callable[..., ServerProcess]:
    """``fake_server(*flags)``: the runtime over the fake engine behind the real API, started."""

    def make(*flags: str) -> ServerProcess:
        fake = [sys.executable, "-m", "warmstart.runtime.api", "--fake"]
        return servers(lambda port: [*fake, "--port", str(port), *flags])

    return make


@pytest.fixture
def plain_server(servers) -> ServerProcess:
    """A plain OpenAI-compatible server (no ``/v1/warmstart``, no ``/health``), started."""
    return servers(
        lambda port: [sys.executable, "-m", "tests.app.plain_server", "--port", str(port)]
    )
