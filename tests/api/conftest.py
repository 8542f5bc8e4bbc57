"""Real server processes on loopback for the API tests.

The server command is a fixture so the same tests can run against the real model:
set ``WARMSTART_TEST_SERVER_CMD`` (for example ``"warmstart serve --model default"``);
it gets ``--port N`` (and ``--host``, ``--api-key``, ``--max-queue`` where a test
needs them) appended. The default is the fake engine's server, ``python -m warmstart.runtime.api
--fake``; options only the fake understands (token delays) are passed to it alone.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from tests.timing import cpu_seconds, fastest, slowest

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0


@dataclass
class Server:
    base_url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen[bytes]
    log_path: Path
    # Wall seconds from its command to its first healthy /health: a baseline of fixed
    # work (imports, loading) at this machine's present load, for how soon it stops.
    started_s: float = 0.0

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def server_cmd() -> list[str]:
    """The command that starts a server, without --port."""
    custom = os.environ.get("WARMSTART_TEST_SERVER_CMD")
    return (
        shlex.split(custom) if custom else [sys.executable, "-m", "warmstart.runtime.api", "--fake"]
    )


@pytest.fixture(scope="session")
def is_fake(server_cmd: list[str]) -> bool:
    return "--fake" in server_cmd


# A hang guard in wall seconds: a server that waits on nothing uses no CPU, so its
# CPU budget alone would never run out.
HANG_FACTOR = 10


def _wait_healthy(server: Server, timeout_s: float) -> None:
    """Until /health answers. ``timeout_s`` counts the server's own CPU seconds, not
    the wall clock's: loading and calibrating is a fixed amount of work, which takes
    several times as long on a machine whose cores other work shares."""
    process = psutil.Process(server.process.pid)
    wall_deadline = time.monotonic() + HANG_FACTOR * timeout_s
    while time.monotonic() < wall_deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited early:\n{server.log()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(server.base_url + "/health", timeout=1.0).status_code == 200:
                return
        with contextlib.suppress(psutil.Error):  # it may have exited since the poll
            if cpu_seconds(process) > timeout_s:
                break
        time.sleep(0.1)
    raise RuntimeError(f"server not healthy after {timeout_s} s of its CPU:\n{server.log()}")


@contextlib.contextmanager
def run_server(
    cmd: list[str],
    *args: str,
    fake_args: tuple[str, ...] = (),
    start_timeout_s: float = START_TIMEOUT_S,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[Server]:
    """Starts a server on a free loopback port, waits for /health (``start_timeout_s``:
    seconds of the server's CPU, see _wait_healthy), stops it after.
    Its output goes to ``server.log`` in ``log_dir`` (default: a temporary one);
    ``env`` adds environment variables (settings as ``WARMSTART_<NAME>``)."""
    port = free_port()
    argv = [*cmd, "--port", str(port), *args]
    if "--fake" in cmd:
        argv += fake_args
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    with contextlib.ExitStack() as stack:
        where = log_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        log_path = where / "server.log"
        log_file = stack.enter_context(log_path.open("wb"))
        launched = time.monotonic()
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log_file, stderr=log_file, preexec_fn=preexec_fn
        )
        server = Server(f"http://127.0.0.1:{port}", process, log_path)
        try:
            _wait_healthy(server, start_timeout_s)
            server.started_s = time.monotonic() - launched
            yield server
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="session")
def start(server_cmd: list[str]) -> Callable[..., contextlib.AbstractContextManager[Server]]:
    """``with start("--api-key", "k", fake_args=(...), env={...}) as server:``."""
    return lambda *args, fake_args=(), **kw: run_server(
        server_cmd, *args, fake_args=fake_args, **kw
    )


@pytest.fixture(scope="session")
def server(server_cmd: list[str]) -> Iterator[Server]:
    """One shared server; tokens trickle (10 ms) so streams and concurrency are real."""
    with run_server(server_cmd, fake_args=("--token-delay", "0.01")) as srv:
        yield srv


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    # Any key works on loopback without --api-key; the client insists on one.
    with openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0, timeout=60) as c:
        yield c


def refusal_times(url: str, body: dict[str, Any]) -> tuple[httpx.Response, float, float]:
    """``body`` POSTed to ``url`` three times: its response and the fastest of those
    times, and the slowest of three of the same body refused for a bad max_tokens
    (read and validated, nothing more): a refusal before any template or token
    takes about as long as that on any machine, at any load."""
    post = lambda payload: httpx.post(url, json=payload, timeout=120)  # noqa: E731
    invalid = {**body, "max_tokens": -1}
    assert post(invalid).status_code == 400
    parsed = slowest(lambda: post(invalid))
    refused, response = fastest(lambda: post(body))
    return response, refused, parsed
