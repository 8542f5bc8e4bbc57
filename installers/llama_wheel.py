"""llama-cpp-python's wheel, compiled once per build flags and shared by every install.

    python installers/llama_wheel.py --key                  the folder name for $CMAKE_ARGS
    python installers/llama_wheel.py --version 0.3.36       the wheel's path (built if need be)

Every install path (the Makefile, installers/linux/install.sh and install-server.sh,
installers/macos/install.sh, the container) asks this script for the wheel, so that
llama-cpp-python compiles once per machine and build: into
``~/.cache/warmstart/llama-wheels/<build>/`` (``$XDG_CACHE_HOME`` when set), where
``<build>`` is ``cpu`` without CMAKE_ARGS, else a digest of them. The folder keeps
the flags it was built with (``build-flags``); a wheel is reused only where they
match. pip's own cache is bypassed: it keys a built wheel by version, not by flags.

A compile takes 10-20 minutes on 2 cores. Meanwhile this script shows a bar with the
step, read from the build's own output (``pip wheel -v``: cmake, then ninja's
``[12/180] ...`` lines or make's ``[ 12%] ...`` ones), and keeps the whole output in
``build.log`` beside the wheel, whose tail it prints if the build fails.
Standard library only: it runs with any Python 3.11+, before warmstart is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TextIO

if __package__:
    from .llama_patches import PATCH_TAG, SOURCE_PATCHES
else:  # run as a script (python installers/llama_wheel.py), before warmstart is installed
    from llama_patches import PATCH_TAG, SOURCE_PATCHES  # type: ignore[import-not-found,no-redef]

PACKAGE = "llama-cpp-python"
FLAGS_FILE = "build-flags"
_VERSION_LINE = re.compile(r'^__version__ = "([^"+]+)"$', re.MULTILINE)
EXPECTED = "10-20 min on 2 cores"  # the CPU build, measured; a GPU one takes longer
_STEP = re.compile(r"^\s*\[\s*(\d+)/(\d+)\]\s+(.*)$")  # ninja: [12/180] command
_PERCENT = re.compile(r"^\s*\[\s*(\d+)%\]\s+(.*)$")  # make: [ 12%] Building C object x.o
_SOURCE = re.compile(r"\s-c\s+(\S+)")  # the file a compiler command compiles
_OUTPUT = re.compile(r"\s-o\s+(\S+)")  # what a link command writes
COMPILING = "compiling llama.cpp"
PHASES = ("fetching the source", "installing the build tools", "configuring (cmake)",
          COMPILING, "packing the wheel")  # fmt: skip


def normal_flags(cmake_args: str) -> str:
    """The flags as one canonical string: " -DGGML_CUDA=on" and "-DGGML_CUDA=on" build
    the same wheel, and must find the same folder."""
    return " ".join(cmake_args.split())


def build_key(cmake_args: str) -> str:
    """The cache folder's name: ``cpu-<tag>`` without flags, else a digest of them and
    the tag (a folder of upstream's build, ``cpu``, is never reused)."""
    flags = normal_flags(cmake_args)
    if not flags:
        return f"cpu-{PATCH_TAG}"
    return hashlib.sha256(f"{flags} {PATCH_TAG}".encode()).hexdigest()[:12]


def recorded(flags: str) -> str:
    """What a folder's FLAGS_FILE says of the wheel in it: its flags and the patch."""
    return f"{flags} patch={PATCH_TAG}".strip()


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ["HOME"], ".cache")
    return Path(base) / "warmstart" / "llama-wheels"


def cached_wheel(folder: Path, version: str, flags: str) -> Path | None:
    """The folder's wheel of ``version``, if it was built with ``flags`` and this
    patch (its FLAGS_FILE says so: a folder without one holds upstream's build)."""
    kept = folder / FLAGS_FILE
    built_with = kept.read_text().strip() if kept.is_file() else ""
    if normal_flags(built_with) != recorded(flags):
        return None
    found = sorted(folder.glob(f"{PACKAGE.replace('-', '_')}-{version}+warmstart.*.whl"))
    return found[-1] if found else None


# -- reading the build's output ------------------------------------------------------------
@dataclass(frozen=True)
class Progress:
    phase: str  # what the build does now, in words
    done: int = 0  # steps done, of total (0 of 0 before the compile starts)
    total: int = 0
    step: str = ""  # the file being compiled or linked

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0


def _step_name(command: str) -> str:
    """'ggml-cpu.cpp' for a compile, 'linking libggml.so' for a link, else the text."""
    if command.startswith(("Building ", "Linking ")):  # make's and plain ninja's words
        verb, _, target = command.rpartition(" ")
        name = os.path.basename(target).removesuffix(".o")
        return name if verb.startswith("Building") else f"linking {name}"
    source = _SOURCE.search(command)
    if source:
        return os.path.basename(source.group(1))
    output = _OUTPUT.search(command)
    if output:
        return "linking " + os.path.basename(output.group(1))
    return command[:40]


def read_progress(lines: Iterable[str]) -> Iterator[Progress]:
    """One Progress per line that moves the build on; other lines yield nothing. The
    phases only go forward: pip's nested install of the build tools says "Collecting"
    again, which is not a new download of the source."""
    reached = -1
    for raw in lines:
        line = raw.rstrip("\n")
        step = _STEP.match(line)
        percent = _PERCENT.match(line)
        if step:
            done, total, what = int(step.group(1)), int(step.group(2)), step.group(3)
        elif percent:
            done, total, what = int(percent.group(1)), 100, percent.group(2)
        else:
            phase = _phase(line.strip())
            if phase is not None and PHASES.index(phase) > reached:
                reached = PHASES.index(phase)
                yield Progress(phase)
            continue
        reached = max(reached, PHASES.index(COMPILING))
        yield Progress(COMPILING, done, total, _step_name(what))


def _phase(line: str) -> str | None:
    if line.startswith(("Collecting ", "Downloading ", "Obtaining ")):
        return PHASES[0]
    if line.startswith("Installing build dependencies"):
        return PHASES[1]
    if line.startswith(("*** Configuring CMake", "-- The C compiler")):
        return PHASES[2]
    if line.startswith(("*** Installing project", "*** Making wheel", "-- Installing:")):
        return PHASES[4]
    return None


# -- showing it ---------------------------------------------------------------------------
def render(p: Progress, elapsed: float, width: int = 24) -> str:
    """One status line: bar, percentage, step, time spent and, once a tenth is done,
    a rough estimate of what is left (steps differ in length: it is a guess)."""
    spent = _minutes(elapsed)
    if not p.total:
        return f"  {p.phase}... ({spent})"
    filled = round(width * p.fraction)
    bar = "#" * filled + "." * (width - filled)
    left = ""
    if p.fraction >= 0.1:
        left = f", about {_minutes(elapsed / p.fraction - elapsed)} left"
    steps = f" {p.done}/{p.total}" if p.total != 100 else ""  # make counts in percent
    return f"  [{bar}] {p.fraction:4.0%}{steps}  {p.step[:32]}  ({spent}{left})"


def _minutes(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


class Display:
    """On a terminal, one line redrawn in place; elsewhere (a log, a pipe), a line at
    each phase and each tenth of the compile, so that a log stays short."""

    def __init__(self, out: TextIO, tty: bool | None = None) -> None:
        self.out, self.tty = out, out.isatty() if tty is None else tty
        self.started = time.monotonic()
        self._last: tuple[str, int] | None = None

    def show(self, p: Progress) -> None:
        text = render(p, time.monotonic() - self.started)
        if self.tty:
            self.out.write("\r\033[K" + text)
        else:
            mark = (p.phase, int(p.fraction * 10))
            if mark == self._last:
                return
            self._last = mark
            self.out.write(text + "\n")
        self.out.flush()

    def end(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


def run_showing(
    argv: list[str], log: Path, display: Display, env: dict[str, str], append: bool = False
) -> int:
    """Runs the build, its whole output into ``log``, its progress to the display."""
    with (
        log.open("a" if append else "w", encoding="utf-8") as keep,
        subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
        ) as proc,  # fmt: skip
    ):
        assert proc.stdout is not None
        for line in _kept(proc.stdout, keep):
            for p in read_progress([line]):
                display.show(p)
        code = proc.wait()
    display.end()
    return code


def _kept(stream: Iterable[str], keep: TextIO) -> Iterator[str]:
    for line in stream:
        keep.write(line)
        yield line


# -- building ---------------------------------------------------------------------------
def ensure_wheel(version: str, cmake_args: str, python: str, out: TextIO = sys.stderr) -> Path:
    """The cached wheel, else a new one compiled into the cache (atomically: a build
    that is stopped leaves no half wheel behind)."""
    flags = normal_flags(cmake_args)
    folder = cache_root() / build_key(flags)
    found = cached_wheel(folder, version, flags)
    if found is not None:
        print(f"==> reusing the compiled {PACKAGE} {version} in {folder}", file=out)
        return found
    what = f"with {flags}: longer than the CPU build's" if flags else "for the CPU:"
    print(f"==> compiling {PACKAGE} {version} {what} {EXPECTED} (this machine has "
          f"{os.cpu_count()}); once, kept in {folder}", file=out)  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    log = folder / "build.log"
    with tempfile.TemporaryDirectory(dir=folder, prefix=".building-") as tmp:
        env = {**os.environ, "CMAKE_ARGS": flags}
        display = Display(out)
        source = fetch_source(version, python, Path(tmp), log, display, env)
        patch_source(source)
        argv = [python, "-m", "pip", "wheel", "-v", "--no-deps", "--no-cache-dir",
                "--disable-pip-version-check", "-w", tmp, str(source)]  # fmt: skip
        if run_showing(argv, log, display, env, append=True) != 0:
            _failed(log, out, "did not compile")
        (built,) = Path(tmp).glob("*.whl")
        (folder / FLAGS_FILE).write_text(recorded(flags) + "\n")
        shutil.move(built, folder / built.name)
    _hand_back(folder)
    print(f"==> compiled in {_minutes(time.monotonic() - started)}", file=out)
    return folder / built.name


def _failed(log: Path, out: TextIO, what: str) -> NoReturn:
    tail = log.read_text(errors="replace").splitlines()[-40:]
    print("\n".join(tail), file=out)
    raise SystemExit(f"{PACKAGE} {what}; the whole output is in {log}")


def fetch_source(
    version: str, python: str, tmp: Path, log: Path, display: Display, env: dict[str, str]
) -> Path:
    """The pinned sdist from PyPI, unpacked under ``tmp``: its folder."""
    argv = [python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--disable-pip-version-check", "-d", str(tmp), f"{PACKAGE}=={version}"]  # fmt: skip
    if run_showing(argv, log, display, env) != 0:
        _failed(log, display.out, "could not be fetched")
    (sdist,) = tmp.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "src", filter="data")
    (source,) = (tmp / "src").iterdir()
    return source


def patch_source(source: Path) -> None:
    """Applies SOURCE_PATCHES and the version's tag; each upstream text must be there
    exactly once (a pinned sdist that changed stops the build, never builds upstream's
    kernels under warmstart's tag)."""
    for name, upstream, ours in SOURCE_PATCHES:
        path = source / name
        text = path.read_text()
        if text.count(upstream) != 1:
            raise SystemExit(f"{PACKAGE}'s {name} is not the one warmstart patches")
        path.write_text(text.replace(upstream, ours))
    init = source / "llama_cpp" / "__init__.py"
    text, n = _VERSION_LINE.subn(rf'__version__ = "\1+warmstart.{PATCH_TAG}"', init.read_text())
    if n != 1:
        raise SystemExit(f"{PACKAGE}'s version line is not the one warmstart tags")
    init.write_text(text)


def _hand_back(folder: Path) -> None:
    """Under sudo that keeps the user's HOME, what root made in the user's cache goes
    back to the user: their next `make run` must be able to write there."""
    home = Path(os.environ.get("HOME", "/"))
    try:
        owner = home.stat()
    except OSError:
        return
    if os.geteuid() != 0 or owner.st_uid == 0 or not folder.is_relative_to(home):
        return
    made = [*folder.iterdir(), folder, *folder.parents]
    for path in made:
        if path == home or not path.is_relative_to(home):
            continue
        if path.stat().st_uid == 0:
            os.chown(path, owner.st_uid, owner.st_gid)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--key", action="store_true", help="print the build folder's name and stop")
    p.add_argument("--version", help=f"the {PACKAGE} version to provide")
    p.add_argument("--python", default=sys.executable, help="the Python whose pip builds")
    args = p.parse_args(argv)
    cmake_args = os.environ.get("CMAKE_ARGS", "")
    if args.key:
        print(build_key(cmake_args))
        return 0
    if not args.version:
        p.error("--version is needed (or --key)")
    print(ensure_wheel(args.version, cmake_args, args.python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
