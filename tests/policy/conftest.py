"""Keeps the user's environment and config file out of the policy tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _clean_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("WARMSTART_"):
            monkeypatch.delenv(name)
    # an empty config file keeps the user's own out (a named, missing one is an error)
    (tmp_path / "empty.toml").write_text("")
    monkeypatch.setenv("WARMSTART_CONFIG", str(tmp_path / "empty.toml"))
