"""The server's key from a file or a systemd credential, and READY=1 for Type=notify."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from warmstart.runtime.api._notify import notify_when_ready, sd_notify
from warmstart.runtime.errors import ConfigError
from warmstart.runtime.settings import load_settings


@pytest.fixture(autouse=True)
def _clean_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("WARMSTART_") or name in ("CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET"):
            monkeypatch.delenv(name)
    # an empty config file keeps the user's own out (a named, missing one is an error)
    (tmp_path / "empty.toml").write_text("")
    monkeypatch.setenv("WARMSTART_CONFIG", str(tmp_path / "empty.toml"))


def test_key_file_flag_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = tmp_path / "key"
    key.write_text("s3cret-key-123\n")
    assert load_settings(api_key_file=key).api_key == "s3cret-key-123"
    monkeypatch.setenv("WARMSTART_API_KEY_FILE", str(key))
    assert load_settings().api_key == "s3cret-key-123"
    assert load_settings(api_key="given-on-purpose").api_key == "given-on-purpose"


def test_missing_key_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="api_key_file"):
        load_settings(api_key_file=tmp_path / "absent")


def test_systemd_credential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert load_settings().api_key is None  # no credential of that name: no key
    (tmp_path / "warmstart-api-key").write_text("from-systemd-1234\n")
    assert load_settings().api_key == "from-systemd-1234"


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(10)
    yield sock
    sock.close()


def test_sd_notify(tmp_path: Path, notify_socket: socket.socket) -> None:
    assert not sd_notify("READY=1", "")
    assert sd_notify("READY=1", str(tmp_path / "notify"))
    assert notify_socket.recv(100) == b"READY=1"


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_ready_once_health_answers(
    tmp_path: Path, notify_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert notify_when_ready("127.0.0.1", 1) is None  # not under systemd: nothing to do
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    with ThreadingHTTPServer(("127.0.0.1", 0), _Health) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        thread = notify_when_ready("0.0.0.0", httpd.server_address[1])
        assert thread is not None
        assert notify_socket.recv(100).startswith(b"READY=1")
        httpd.shutdown()
    thread.join(10)
