"""Where the app keeps its files."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "warmstart"


def data_dir() -> Path:
    """``$WARMSTART_APP_DATA`` (tests, portable installs) or the platform's data dir."""
    explicit = os.environ.get("WARMSTART_APP_DATA")
    if explicit:
        return Path(explicit)
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)) / "app"
