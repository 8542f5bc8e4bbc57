"""Fixtures for the installer tests (helpers.py says how pip avoids a rebuild)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import cached_llama_wheel, need_root


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A world-traversable directory (pytest's tmp_path is 0700, closed to other users)."""
    path = Path(tempfile.mkdtemp(prefix="warmstart-installer-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def wheelhouse(scratch: Path) -> Path:
    house = scratch / "wheelhouse"
    house.mkdir(mode=0o755)
    wheel = house / cached_llama_wheel().name
    shutil.copyfile(cached_llama_wheel(), wheel)
    wheel.chmod(0o644)
    return house


@pytest.fixture
def throwaway_user() -> Iterator[str]:
    """A login-less user for the test, removed afterwards (reused if a crash left it)."""
    need_root()
    name = "wstest-desktop"
    created = subprocess.run(["id", name], capture_output=True).returncode != 0
    if created:
        subprocess.run(
            ["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/bin/sh",
             name],
            check=True,
        )  # fmt: skip
    yield name
    if created:
        subprocess.run(["userdel", name], check=False)
