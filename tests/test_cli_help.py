"""Each subcommand shows only the settings it uses, with defaults, bounds and choices."""

from __future__ import annotations

import argparse

import pytest
from warmstart.runtime._flags import GROUPS
from warmstart.runtime.cli import build_parser
from warmstart.runtime.settings import Settings


def _help(command: str) -> str:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return str(action.choices[command].format_help())
    raise AssertionError(command)


def test_every_setting_belongs_to_one_group() -> None:
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(Settings.model_fields)


def test_ask_shows_model_context_and_sampling_with_defaults_bounds_choices() -> None:
    text = " ".join(_help("ask").split())
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
