"""Everyday mistakes end with one clear line and a meaningful exit code, never a
traceback: a missing id, a reader that leaves early, a config file that is not there,
a command that finishes before prewarm does."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from warmstart.runtime.errors import ConfigError
from warmstart.runtime.serving._sessions import SessionBook
from warmstart.runtime.types import Message

from tests.conftest import chat


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "warmstart.runtime.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


@pytest.fixture
def no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("WARMSTART_"):
            monkeypatch.delenv(name)
    config = tmp_path / "empty.toml"
    config.write_text("")
    monkeypatch.setenv("WARMSTART_CONFIG", str(config))
    return tmp_path


def test_version_is_on_the_top_level_parser(capsys: pytest.CaptureFixture[str]) -> None:
    from warmstart.runtime.cli._main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("warmstart ")


@pytest.mark.parametrize("action", ["show", "delete"])
def test_sessions_without_an_id_is_a_usage_error(no_user_config: Path, action: str) -> None:
    proc = _cli("sessions", action, "--data-dir", str(no_user_config))
    assert proc.returncode == 2
    assert "give the conversation's id" in proc.stderr
    assert "None" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["ask", "chat"])
def test_an_unsafe_session_id_is_refused_before_any_model_loads(
    no_user_config: Path, command: str
) -> None:
    # a model that does not exist: the refusal must come first, or this says "no model"
    args = [command, "--session", "../../etc/passwd", "--data-dir", str(no_user_config)]
    args += ["--model", str(no_user_config / "absent.gguf")]
    proc = _cli(*args, *(["hello"] if command == "ask" else []))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("warmstart: --session: '../../etc/passwd' contains a slash")
    assert "Traceback" not in proc.stderr


def test_a_named_config_file_that_is_missing_is_an_error(
    no_user_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from warmstart.runtime.settings import load_settings

    missing = no_user_config / "nowhere.toml"
    monkeypatch.setenv("WARMSTART_CONFIG", str(missing))
    with pytest.raises(ConfigError, match="WARMSTART_CONFIG"):
        load_settings()
    proc = _cli("sessions", "list", "--data-dir", str(no_user_config))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"warmstart: WARMSTART_CONFIG: no config file at {missing}"
    ]


def test_sessions_list_into_head_exits_0_without_a_traceback(no_user_config: Path) -> None:
    book = SessionBook(no_user_config / "sessions.db")
    for i in range(3000):  # more than a pipe holds: the writer meets the closed pipe
        book.save(f"s{i:05d}", (Message("user", f"question number {i}"),), 10, None, None)
    book.close()
    proc = subprocess.run(
        [
            "bash",
            "-o",
            "pipefail",
            "-c",
            f'"{sys.executable}" -m warmstart.runtime.cli sessions list'
            f' --data-dir "{no_user_config}" | head -1',
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 1
    assert proc.stderr == ""


@pytest.mark.slow
def test_close_right_after_start_stops_prewarm_quietly(
    make_runtime, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    from warmstart.runtime.serving._factory import start_prewarm

    first = make_runtime()
    for i in range(4):
        first.generate(chat(f"Count to {i + 3}.", max_tokens=4, session_id=f"s{i}")).text()
    first.store.flush()
    first.close()
    for _ in range(3):  # the race was timing-dependent: try it a few times
        rt = make_runtime()
        with caplog.at_level(logging.ERROR):
            thread = start_prewarm(rt, 4)
            rt.close()  # a short command finishing at once
        assert not thread.is_alive()
        assert "prewarm failed" not in caplog.text
