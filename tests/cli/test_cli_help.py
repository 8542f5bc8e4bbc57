"""Each subcommand shows only the settings it uses, with defaults, bounds and choices;
ask and chat show their everyday options on one screen, the rest with --help-all."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from warmstart.runtime.cli._flags import GROUPS
from warmstart.runtime.cli._parser import build_parser
from warmstart.runtime.settings import Settings


def _help(command: str, show_all: bool = False) -> str:
    parser = build_parser(show_all=show_all)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return str(action.choices[command].format_help())
    raise AssertionError(command)


def test_every_setting_belongs_to_one_group() -> None:
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(Settings.model_fields)


def test_ask_help_all_shows_model_context_and_sampling_with_defaults_bounds_choices() -> None:
    text = " ".join(_help("ask", show_all=True).split())
    for flag in ("--n-ctx", "--model", "--chunk-tokens", "--max-tokens", "--temperature"):
        assert flag in text
    assert "256 <= value <= 262144" in text  # n_ctx's bounds
    assert "{f16,q8_0}" in text and "{trim,error}" in text  # choices
    assert "default: 256" in text  # max_tokens
    assert "automatic: chosen for this machine" in text
    for flag in ("--cors-origins", "--max-queue", "--header-timeout"):
        assert flag not in text


@pytest.mark.parametrize("command", ["sessions", "cache"])
def test_sessions_and_cache_show_where_data_lives_and_the_server(command: str) -> None:
    text = _help(command)
    assert "--data-dir" in text and "--cache-dir" in text and "--port" in text
    assert "--n-ctx" not in text and "--chunk-tokens" not in text


def test_serve_shows_everything() -> None:
    text = _help("serve")
    for name in Settings.model_fields:
        assert "--" + name.replace("_", "-") in text


EVERYDAY = ("--session", "--system", "--max-tokens", "--temperature", "--model")
ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    cmd = [sys.executable, "-m", "warmstart.runtime.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("command", ["ask", "chat"])
def test_ask_and_chat_help_fits_a_screen_with_the_everyday_options_first(command: str) -> None:
    proc = _run(command, "--help")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) <= 50, proc.stdout  # it was 137
    text = proc.stdout
    for flag in EVERYDAY:
        assert flag in text, flag
    # the conversation's own options come before the settings
    assert text.index("--session") < text.index("--model") < text.index("more settings")
    for tunable in ("--chunk-tokens", "--zstd-level", "--high-watermark", "--decode-threads"):
        assert tunable not in text
    assert f"warmstart {command} --help-all" in text


@pytest.mark.parametrize("command", ["ask", "chat"])
def test_help_all_lists_every_setting_the_command_uses(command: str) -> None:
    proc = _run(command, "--help-all")
    assert proc.returncode == 0, proc.stderr
    for flag in (*EVERYDAY, "--chunk-tokens", "--zstd-level", "--decode-threads"):
        assert flag in proc.stdout, flag
    assert "--cors-origins" not in proc.stdout  # still only what the command uses


def test_a_tunable_left_out_of_help_is_still_accepted() -> None:
    args = build_parser().parse_args(["ask", "q", "--chunk-tokens", "64", "--zstd-level", "0"])
    assert args.chunk_tokens == 64 and args.zstd_level == 0


def test_app_help_is_the_apps_own() -> None:
    pytest.importorskip("PySide6")
    proc = _run("app", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: warmstart app" in proc.stdout
    assert "--server URL" in proc.stdout and "--theme" in proc.stdout
    assert "app_args" not in proc.stdout


def test_the_pyside6_hint_names_this_interpreters_pip(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    from warmstart.runtime.cli import _commands as cli

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "PySide6" else real(name, *a)
    )
    assert cli.run_app([]) == 2
    err = capsys.readouterr().err
    assert f"{sys.executable} -m pip install 'warmstart[app]'" in err
