"""``app.main()`` reads its options from the command line it was started with."""

from __future__ import annotations

import sys

import pytest
from warmstart.app.qt.main import command_line_args, parse_args


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["/x/app/__main__.py", "--server", "http://h:1/v1"],
            (["--server", "http://h:1/v1"], False),
        ),
        (["/x/app/__main__.py", "app"], (["app"], False)),  # python -m app: all of it is ours
        (["/venv/bin/warmstart", "app"], ([], True)),
        (["/venv/bin/warmstart", "-v", "app", "--theme", "dark"], (["--theme", "dark"], True)),
        (["/x/runtime/cli/_main.py", "app", "--no-autostart"], (["--no-autostart"], True)),
        (["ipython"], ([], False)),
    ],
)
def test_the_apps_own_arguments(argv, expected):
    assert command_line_args(argv) == expected


def test_main_without_argv_reads_sys_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/warmstart", "app", "--theme", "dark"])
    assert parse_args(None).theme == "dark"
    # warmstart's own settings flags (its parser took them) are ignored, with a warning
    monkeypatch.setattr(sys, "argv", ["/venv/bin/warmstart", "app", "--n-ctx", "512"])
    assert parse_args(None).theme == "system"
    monkeypatch.setattr(sys, "argv", ["/x/app/__main__.py", "--bogus"])
    with pytest.raises(SystemExit):
        parse_args(None)


def test_the_api_key_can_come_from_a_file(tmp_path):
    from warmstart.app.qt.main import _api_key

    key_file = tmp_path / "key"
    key_file.write_text("from-a-file-123\n")
    assert _api_key(parse_args(["--api-key-file", str(key_file)])) == "from-a-file-123"
    assert _api_key(parse_args([])) is None
