"""The running server's note in the data dir (no server process: see
tests/api/test_serve_introduces.py for the real one)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from warmstart.runtime.cli._remote import Server
from warmstart.runtime.cli._running import (
    Running,
    introduction,
    note_path,
    read_note,
    remove_note,
    write_note,
)
from warmstart.runtime.settings import load_settings

from tests.api.conftest import free_port

pytestmark = pytest.mark.usefixtures("clean_settings")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_note_is_private_and_read_back(tmp_path: Path) -> None:
    running = Running(os.getpid(), "127.0.0.1", 9999, "http", key_required=True)
    path = write_note(tmp_path, running)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_note(tmp_path) == running
    remove_note(tmp_path, os.getpid() + 1)  # not ours: kept
    assert path.exists()
    remove_note(tmp_path, os.getpid())
    assert not path.exists() and read_note(tmp_path) is None


def test_a_note_whose_process_is_gone_or_that_is_garbage_is_ignored(tmp_path: Path) -> None:
    write_note(tmp_path, Running(_dead_pid(), "127.0.0.1", 9999, "http", False))
    assert read_note(tmp_path) is None
    note_path(tmp_path).write_text("{not json")
    assert read_note(tmp_path) is None


def test_a_note_whose_port_does_not_answer_is_passed_over(tmp_path: Path) -> None:
    """A live pid (this very process) on a port nobody listens on: the command goes on
    to the configured server, and without one to the files."""
    write_note(tmp_path, Running(os.getpid(), "127.0.0.1", free_port(), "http", False))
    settings = load_settings(data_dir=tmp_path, port=free_port())
    assert Server.find(settings) is None


def test_the_introduction_gives_the_urls_and_says_whether_a_key_is_needed(
    tmp_path: Path,
) -> None:
    open_ = load_settings(data_dir=tmp_path)
    text = introduction(open_, Running(1, "127.0.0.1", 8765, "http", False), "smollm2-135m")
    assert "serving smollm2-135m on 127.0.0.1:8765" in text
    assert "OpenAI base URL  http://127.0.0.1:8765/v1" in text
    assert "Ollama URL       http://127.0.0.1:8765" in text
    assert "API key          not needed" in text
    assert str(note_path(tmp_path)) in text
    key_file = tmp_path / "key"
    key_file.write_text("s3cret-key-0123456789\n")
    keyed = load_settings(data_dir=tmp_path, host="0.0.0.0", api_key_file=key_file)
    text = introduction(keyed, Running(1, "0.0.0.0", 8765, "https", True), "m")
    assert "OpenAI base URL  https://127.0.0.1:8765/v1" in text
    assert "every address of this machine" in text
    assert f"required: send 'Authorization: Bearer KEY', the key in {key_file}" in text
    assert "s3cret" not in text
