"""``unix_socket``: the server also listens on a Unix-domain socket that only its user
can reach and nobody else can take over (a real server process; the fake runtime)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import ROOT, free_port

pytestmark = pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix sockets")
KEY = "unix-socket-key-0123456789"


def _uds_get(path: Path, url: str, **kw: Any) -> httpx.Response:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), timeout=10) as client:
        return client.get(url, **kw)


def _listening(path: Path) -> bool:
    # a raw connect: httpcore 1.0 leaves a failed one's socket open (a ResourceWarning)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def test_the_server_answers_on_its_socket_and_removes_it_when_it_stops(
    start: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    sock = folder / "server.sock"
    with start("--api-key", KEY, env={"WARMSTART_UNIX_SOCKET": str(sock)}) as srv:
        assert stat.S_ISSOCK(sock.lstat().st_mode)
        assert stat.S_IMODE(sock.lstat().st_mode) == 0o600
        # the URL's host and port do not matter: every byte goes through the socket
        url = "http://127.0.0.1:9/v1/models"
        assert _uds_get(sock, url).status_code == 401
        keyed = _uds_get(sock, url, headers={"Authorization": f"Bearer {KEY}"})
        assert keyed.status_code == 200 and keyed.json()["data"]
        assert _uds_get(sock, "http://127.0.0.1:9/health").json()["status"] == "ok"
        assert httpx.get(srv.base_url + "/health", timeout=5).status_code == 200  # TCP too
        srv.process.terminate()
        assert srv.process.wait(30) == 0
    assert not sock.exists()


def _serve_fake(tmp_path: Path, sock: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    env |= {"PYTHONPATH": str(ROOT), "WARMSTART_UNIX_SOCKET": str(sock)}
    env["WARMSTART_CONFIG"] = str(tmp_path / "empty.toml")
    (tmp_path / "empty.toml").write_text("")
    cmd = [sys.executable, "-m", "warmstart.runtime.api", "--fake", "--port", str(free_port())]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


def test_a_socket_in_a_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # whoever can write here could put their own socket in its place
    proc = _serve_fake(tmp_path, shared / "server.sock")
    assert proc.returncode == 2, proc.stderr
    assert "unix_socket" in proc.stderr and "other users can write" in proc.stderr
    assert not (shared / "server.sock").exists()


def test_a_socket_someone_still_serves_is_refused_and_a_stale_one_replaced(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    path = folder / "server.sock"
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(path))
    live.listen()
    try:
        proc = _serve_fake(tmp_path, path)
        assert proc.returncode == 2 and "is in use" in proc.stderr, proc.stderr
    finally:
        live.close()
    # closed without unlinking, as a killed server leaves it: a leftover, replaced
    assert path.exists()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    env |= {"PYTHONPATH": str(ROOT), "WARMSTART_UNIX_SOCKET": str(path)}
    cmd = [sys.executable, "-m", "warmstart.runtime.api", "--fake", "--port", str(free_port())]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not _listening(path):
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert _uds_get(path, "http://127.0.0.1/health").status_code == 200
    finally:
        server.terminate()
        server.wait(30)
    assert not path.exists()


def test_a_file_that_is_not_a_socket_is_left_alone(tmp_path: Path) -> None:
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    path = folder / "notes.txt"
    path.write_text("mine")
    proc = _serve_fake(tmp_path, path)
    assert proc.returncode == 2 and "is not a socket" in proc.stderr, proc.stderr
    assert path.read_text() == "mine"
