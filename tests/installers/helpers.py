"""Helpers for the installer tests: scratch trees, throwaway users, pip without a rebuild.

The installers are normal installers: they run pip as any user would, and take
llama-cpp-python from the wheel cache all install paths share
(``~/.cache/warmstart/llama-wheels/<build>/``, installers/llama_wheel.py). So that a
test never recompiles it (10-20 minutes), the sandbox's HOME gets the CPU wheel the
developer's own ``make`` left in that cache, as a user who ran ``make run`` first has
it; pip also gets it as a wheelhouse (``PIP_FIND_LINKS``), as a local mirror.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from installers import llama_wheel

REPO = Path(__file__).resolve().parents[2]
LLAMA_WHEEL = "llama_cpp_python-0.3.36+warmstart.*.whl"  # warmstart's build
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: creates a user and runs the installer as that user")
    for tool in ("runuser", "useradd", "userdel"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} (util-linux / passwd)")


def seed_wheel_cache(home: Path) -> Path:
    """``home``'s wheel cache holding the CPU wheel, as ``make`` leaves it."""
    folder = home / ".cache/warmstart/llama-wheels" / llama_wheel.build_key("")
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / cached_llama_wheel().name
    shutil.copyfile(cached_llama_wheel(), wheel)
    (folder / llama_wheel.FLAGS_FILE).write_text(llama_wheel.recorded("") + "\n")
    return wheel


def _pip_caches() -> list[Path]:
    caches = [Path.home() / ".cache" / "pip"]
    if os.environ.get("PIP_CACHE_DIR"):
        caches.insert(0, Path(os.environ["PIP_CACHE_DIR"]))
    return caches


def cached_llama_wheel() -> Path:
    """The llama-cpp-python CPU wheel the developer's venv was installed from, or skip."""
    folder = Path.home() / ".cache/warmstart/llama-wheels" / llama_wheel.build_key("")
    made = sorted(folder.glob(LLAMA_WHEEL))
    if made:
        return made[-1]
    for cache in _pip_caches():
        found = sorted(cache.glob(f"wheels/**/{LLAMA_WHEEL}"))
        if found:
            return found[-1]
    pytest.skip(
        "llama-cpp-python's wheel is not in pip's cache (make .venv/.dev-installed "
        "builds it once): the installer would compile it for 15 minutes"
    )


def pip_env(wheelhouse: Path, cache: Path) -> dict[str, str]:
    """pip's settings from this environment, plus the wheelhouse and a private cache."""
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    links = " ".join(x for x in (str(wheelhouse), env.get("PIP_FIND_LINKS", "")) if x)
    env.update(PIP_FIND_LINKS=links, PIP_CACHE_DIR=str(cache), PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def copy_checkout(into: Path) -> Path:
    """The checkout's files (tracked and new, not ignored), as a user would download them."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        src = REPO / os.fsdecode(name)
        if src.is_file():
            dst = into / os.fsdecode(name)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return into


def chown_tree(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid, follow_symlinks=False)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def run_as(
    user: str, argv: list[str], env: Mapping[str, str], timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Runs ``argv`` as ``user`` with exactly ``env`` (nothing of root's leaks in)."""
    cmd = ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/")


def tree(path: Path) -> list[str]:
    """Every file, link and directory under ``path``, relative, sorted."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def start_on(python: Path, user: str, *, deaf: bool = False) -> subprocess.Popen[str]:
    """A process of ``user`` on ``python``, standing for the app or a server started
    from that venv, once it runs; ``deaf``: one that ignores SIGTERM."""
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if deaf else ""
    code = f"import signal, time; {ignore}print('ready', flush=True); time.sleep(300)"
    proc = subprocess.Popen(
        ["runuser", "-u", user, "--", str(python), "-c", code], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line != "ready\n":  # closed here, not left to warn in whichever test runs next
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise AssertionError(f"{python} did not start as {user}: {line!r}")
    return proc


def pids_on(python: Path) -> list[int]:
    """The processes whose command line starts with ``python``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().startswith(bytes(python) + b"\0"):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue  # it ended meanwhile
    return found


def stop(proc: subprocess.Popen[str], python: Path) -> None:
    """Ends a start_on() process, whatever the test did to it."""
    for pid in pids_on(python):
        os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.communicate()
