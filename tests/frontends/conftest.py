"""The front ends people already use, against a real `warmstart serve`.

These tests run only under ``make test-frontends`` (WARMSTART_FRONTENDS=1): they need
Open WebUI and aider in their own venvs and Debian's Chromium, which that target
installs, and they take minutes. ``make test`` never
collects them.

warmstart runs as a user starts it, ``warmstart serve --model default``, in a fresh data
directory: the default model's file and this machine's calibration for it are copied in
from a cache kept beside the venvs, so a run neither downloads the model again nor
spends minutes calibrating, and no earlier run's KV cache can answer for this one.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.conftest import Server, run_server

if os.environ.get("WARMSTART_FRONTENDS") != "1":
    collect_ignore_glob = ["test_*.py"]

ROOT = Path(__file__).resolve().parents[2]
# Calibration and the model's digest and load verdicts, reused across runs.
_KEPT = ("calibration.json", "digests.json", "extra_buffers.json")


@pytest.fixture(scope="session")
def venvs() -> Path:
    """Where `make test-frontends` put Open WebUI's and aider's venvs (a relative path,
    as the Makefile gives it, from the repository: the front ends run in other folders)."""
    return ROOT / os.environ.get("WARMSTART_FRONTENDS_VENVS", ".venv-frontends")


@pytest.fixture(scope="session")
def out_dir(venvs: Path) -> Path:
    """What a run leaves to look at: screenshots, route logs, the figures."""
    out = Path(os.environ.get("WARMSTART_FRONTENDS_OUT", venvs / "out"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def _seed(data_dir: Path, model_path: Path, kept: Path) -> None:
    models = data_dir / "models"
    models.mkdir(parents=True)
    try:
        os.link(model_path, models / model_path.name)
    except OSError:  # another file system
        shutil.copy2(model_path, models / model_path.name)
    for name in _KEPT:
        if (kept / name).is_file():
            shutil.copy2(kept / name, data_dir / name)


@pytest.fixture(scope="session")
def warmstart(
    model_path: Path, venvs: Path, out_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """`warmstart serve --model default` on a free loopback port, for the whole run."""
    data_dir = tmp_path_factory.mktemp("warmstart-data")
    kept = venvs / "warmstart-kept"
    _seed(data_dir, model_path, kept)
    serve = [str(Path(sys.executable).parent / "warmstart"), "serve"]
    args = ("--model", "default", "--data-dir", str(data_dir))
    with run_server(serve, *args, start_timeout_s=900.0, log_dir=out_dir) as server:
        kept.mkdir(parents=True, exist_ok=True)
        for name in _KEPT:
            if (data_dir / name).is_file():
                shutil.copy2(data_dir / name, kept / name)
        yield server
