"""installers/linux/install.sh, run as a normal user with a fresh HOME, end to end."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from installers.llama_wheel import FLAGS_FILE

from .helpers import (
    SYSTEM_PATH,
    chown_tree,
    copy_checkout,
    pids_on,
    pip_env,
    run_as,
    seed_wheel_cache,
    start_on,
    stop,
    tree,
)

pytestmark = pytest.mark.slow

ICONS = (
    "icons/hicolor/scalable/apps/warmstart.svg",
    "icons/hicolor/256x256/apps/warmstart.png",
    "icons/hicolor/64x64/apps/warmstart.png",
)


class Desktop:
    """One user's HOME and the installer copied out of the checkout."""

    def __init__(self, scratch: Path, user: str, wheelhouse: Path) -> None:
        self.user, self.home = user, scratch / "home"
        self.src = copy_checkout(scratch / "src")
        self.home.mkdir()
        self.wheel = seed_wheel_cache(self.home)  # as `make run` leaves it
        (scratch / "pip-cache").mkdir()
        for path in (self.home, self.src, scratch / "pip-cache"):
            chown_tree(path, user)
        self.env = {"HOME": str(self.home), "PATH": SYSTEM_PATH, "LANG": "C.UTF-8"}
        self.env.update(pip_env(wheelhouse, scratch / "pip-cache"))
        self.data = self.home / ".local/share"
        self.launcher = self.home / ".local/bin/warmstart"

    def run(self, *flags: str) -> subprocess.CompletedProcess[str]:
        # --cpu: a CI machine with nvcc and a GPU would otherwise build CUDA for 30 minutes
        argv = ["sh", str(self.src / "installers/linux/install.sh"), "--cpu", *flags]
        return run_as(self.user, argv, self.env)

    def install(self, *flags: str) -> str:
        proc = self.run(*flags)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    def warmstart(self, *args: str) -> subprocess.CompletedProcess[str]:
        proc = run_as(self.user, [str(self.launcher), *args], self.env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc


@pytest.fixture
def desktop(scratch: Path, throwaway_user: str, wheelhouse: Path) -> Desktop:
    check = "import sys, venv; assert sys.version_info >= (3, 11)"
    probe = run_as(throwaway_user, ["python3", "-c", check], {"PATH": SYSTEM_PATH})
    if probe.returncode != 0:
        pytest.skip("no system python3 >= 3.11 with venv for a normal user")
    return Desktop(scratch, throwaway_user, wheelhouse)


def test_install_ask_upgrade_uninstall_purge(desktop: Desktop) -> None:
    out = desktop.install()
    assert "warmstart is installed" in out and str(desktop.launcher) in out

    reply = desktop.warmstart("ask", "Say hi.", "--max-tokens", "8")
    assert reply.stdout.strip(), "no answer"
    assert "[prompt" in reply.stdout + reply.stderr

    entry = desktop.data / "applications/warmstart.desktop"
    text = entry.read_text()
    assert f"Exec={desktop.launcher} app" in text and "Icon=warmstart" in text and "@" not in text
    if shutil.which("desktop-file-validate"):
        checked = subprocess.run(["desktop-file-validate", str(entry)], capture_output=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    for icon in ICONS:
        assert (desktop.data / icon).stat().st_size > 0, icon

    sessions = desktop.warmstart("sessions", "list").stdout
    assert sessions.strip()
    model = next((desktop.data / "warmstart/models").glob("*.gguf"))
    model_inode = model.stat().st_ino

    out = desktop.install("--upgrade")
    assert "warmstart is installed" in out
    assert desktop.warmstart("sessions", "list").stdout == sessions  # the conversation is kept
    assert model.stat().st_ino == model_inode  # the model was not pulled again

    out = desktop.install("--uninstall")
    left = tree(desktop.home)
    user_data = [p for p in left if p.startswith(".local/share/warmstart/")]
    # the wheel cache the test seeded (as `make run` leaves it) is shared, and stays
    wheels = desktop.wheel.relative_to(desktop.home)
    seeded = {str(p) for p in (wheels, *wheels.parents) if str(p) != "."}
    seeded.add(str(wheels.parent / FLAGS_FILE))  # what it was built with
    assert "kept the compiled llama-cpp-python" in out
    assert set(left) - set(user_data) - seeded == {
        ".local",
        ".local/share",
        ".local/share/warmstart",
    }
    assert not any(p.startswith(".local/share/warmstart/venv") for p in left)
    assert not (desktop.data / "applications").exists() and not (desktop.data / "icons").exists()
    assert model.is_file() and (desktop.data / "warmstart/sessions.db").is_file()

    desktop.install("--uninstall", "--purge")
    assert tree(desktop.home) == []


def _timed(desktop: Desktop, *flags: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = desktop.run(*flags)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, time.monotonic() - started


def test_fresh_install_takes_the_cached_wheel_and_a_second_reuses_it(desktop: Desktop) -> None:
    """A fresh HOME whose wheel cache holds the CPU build (as after `make run`): the
    installer compiles nothing (pip is forbidden to build llama-cpp-python here); a
    second run reuses it too; --uninstall stops what runs from the venv first."""
    desktop.env["PIP_ONLY_BINARY"] = "llama-cpp-python"
    del desktop.env["PIP_FIND_LINKS"]  # the cache alone: no wheelhouse to fall back on
    first, fresh_s = _timed(desktop, "--no-model")
    cache = desktop.wheel.parent
    assert f"reusing the compiled llama-cpp-python 0.3.36 in {cache}" in first.stderr
    assert "compiling" not in first.stdout + first.stderr
    # nothing built: the wheel and the record of its flags and patch, as seeded
    assert sorted(p.name for p in cache.iterdir()) == sorted([FLAGS_FILE, desktop.wheel.name])
    build = (desktop.data / "warmstart/venv/.warmstart-build").read_text()
    assert build.split() == ["cpu", "llama-cpp-python==0.3.36", desktop.wheel.name]
    assert desktop.warmstart("--version").stdout.strip()

    second, again_s = _timed(desktop, "--no-model")
    assert "reusing the compiled llama-cpp-python" in second.stderr
    assert "creating the virtual environment" not in second.stdout  # repaired in place
    # the figures the README gives (printed with pytest -s)
    print(f"\ninstall with a cached wheel: {fresh_s:.0f} s; again: {again_s:.0f} s")
    _uninstall_stops_what_runs(desktop)
    assert desktop.wheel.is_file()  # the cache outlives the program; --purge removes it


def _uninstall_stops_what_runs(desktop: Desktop) -> None:
    """A running app or server of this install is stopped before its venv goes; one
    that does not stop is named, and nothing is removed."""
    venv = desktop.data / "warmstart/venv"
    deaf = start_on(venv / "bin/python", desktop.user, deaf=True)
    try:
        refused = desktop.run("--uninstall")
        assert refused.returncode != 0
        assert f"still running after 15 s: {pids_on(venv / 'bin/python')[0]}" in refused.stderr
        assert "nothing was removed" in refused.stderr and (venv / "bin/python").is_file()
    finally:
        stop(deaf, venv / "bin/python")
    app = start_on(venv / "bin/python", desktop.user)
    try:
        out = desktop.install("--uninstall")
        assert f"stopping what runs from {venv}" in out
        assert app.wait(timeout=30) != 0  # ended by SIGTERM, before the removal
        assert not venv.exists()
    finally:
        stop(app, venv / "bin/python")
