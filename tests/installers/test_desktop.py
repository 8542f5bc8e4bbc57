"""installers/linux/install.sh, run as a normal user with a fresh HOME, end to end."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from .helpers import SYSTEM_PATH, chown_tree, copy_checkout, pip_env, run_as, tree

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
        (scratch / "pip-cache").mkdir()
        for path in (self.home, self.src, scratch / "pip-cache"):
            chown_tree(path, user)
        self.env = {"HOME": str(self.home), "PATH": SYSTEM_PATH, "LANG": "C.UTF-8"}
        self.env.update(pip_env(wheelhouse, scratch / "pip-cache"))
        self.data = self.home / ".local/share"
        self.launcher = self.home / ".local/bin/warmstart"

    def install(self, *flags: str) -> str:
        # --cpu: a CI machine with nvcc and a GPU would otherwise build CUDA for 30 minutes
        argv = ["sh", str(self.src / "installers/linux/install.sh"), "--cpu", *flags]
        proc = run_as(self.user, argv, self.env)
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

    desktop.install("--uninstall")
    left = tree(desktop.home)
    user_data = [p for p in left if p.startswith(".local/share/warmstart/")]
    assert set(left) - set(user_data) == {".local", ".local/share", ".local/share/warmstart"}
    assert not any(p.startswith(".local/share/warmstart/venv") for p in left)
    assert not (desktop.data / "applications").exists() and not (desktop.data / "icons").exists()
    assert model.is_file() and (desktop.data / "warmstart/sessions.db").is_file()

    desktop.install("--uninstall", "--purge")
    assert tree(desktop.home) == []
