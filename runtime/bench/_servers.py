"""Starting and stopping the benchmark's servers, each in a fresh home: a free
loopback port, waiting until it answers, stopping its whole process group on the way
out (no llama-server is left running on a shared machine), and its environment."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PeerError


def run_checked(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    """Runs ``cmd`` to its end; a failure is a PeerError with its output's last lines."""
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise PeerError(f"{what} failed ({proc.returncode}):\n" + "\n".join(tail))


@dataclass
class Server:
    """How to start one system: argv for a port and a home, its environment, and what
    runs once in the home before the first start (warmstart's calibration)."""

    name: str
    argv: Callable[[int, Path], list[str]]
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[Path, dict[str, str]], None] | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_up(url: str, proc: subprocess.Popen[bytes], logfile: Path, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PeerError(
                f"{url}: the server exited ({proc.returncode}); "
                f"last lines of {logfile}:\n{_tail(logfile)}"
            )
        # llama-server answers 503 while it loads: any error means not yet
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/v1/models", timeout=2):
            return
        time.sleep(0.3)
    raise PeerError(f"{url}: the server did not come up in {limit:.0f} s; see {logfile}")


def _tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


class Served(str):
    """A running server's base URL, knowing its process group (to tell when it is idle)."""

    pid: int


def _group_ticks(pgid: int) -> int:
    """User and system CPU time so far of every process in the group ``pgid`` (a server
    and what it started: hearth's llama-server), in clock ticks; 0 without /proc."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total


def wait_quiet(servers: list[Served], limit_s: float = 180.0, window_s: float = 1.0) -> float:
    """Waits until no server uses over 5% of a core for ``window_s``, at most ``limit_s``;
    returns how long it waited. Systems that are up side by side share two cores: one
    still working after its reply (warmstart settles a reply and stores what it
    computed, several seconds at the 1B shape) would slow the next one's figures."""
    t0 = time.monotonic()
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    while time.monotonic() - t0 < limit_s:
        before = [_group_ticks(s.pid) for s in servers]
        time.sleep(window_s)
        used = [_group_ticks(s.pid) - b for s, b in zip(servers, before, strict=True)]
        if max(used, default=0) <= 0.05 * hz * window_s:
            break
    return time.monotonic() - t0


@contextlib.contextmanager
def running(server: Server, home: Path, phase: str, env: dict[str, str]) -> Iterator[Served]:
    """A started server's base URL; stopped (SIGTERM, then SIGKILL) on the way out."""
    port = free_port()
    logfile = home / f"{phase}.log"
    with open(logfile, "wb") as out:
        proc = subprocess.Popen(
            server.argv(port, home),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = Served(f"http://127.0.0.1:{port}")
    url.pid = proc.pid
    try:
        _wait_up(url, proc, logfile, limit=600)
        yield url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def server_env(server: Server, home: Path) -> dict[str, str]:
    # no WARMSTART_ variable and an empty config: the user's own settings stay out
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    (home / "empty.toml").touch()
    return {**env, "HOME": str(home), "WARMSTART_CONFIG": str(home / "empty.toml"), **server.env}
