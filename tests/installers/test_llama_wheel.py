"""installers/llama_wheel.py: the shared wheel cache and the compile's progress, on
recorded build output (a real `pip wheel -v` of a small scikit-build-core project
with ninja, and a real cmake/make build of llama.cpp on this machine), never on a
real compile of llama-cpp-python (10-20 minutes)."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from installers import llama_wheel as lw

DATA = Path(__file__).parent / "data"
NINJA_LOG = DATA / "pip-wheel-ninja.log"
MAKE_LOG = DATA / "cmake-make-llama.log"
WHEEL = f"llama_cpp_python-0.3.36+warmstart.{lw.PATCH_TAG}-py3-none-linux_x86_64.whl"


def test_progress_from_pip_and_ninja() -> None:
    seen = list(lw.read_progress(NINJA_LOG.read_text().splitlines()))
    phases = [p.phase for p in seen if not p.total]
    assert phases == ["installing the build tools", "configuring (cmake)", "packing the wheel"]
    steps = [(p.done, p.total, p.step) for p in seen if p.total]
    assert [s[:2] for s in steps] == [(n, 7) for n in range(1, 8)]
    assert steps[0][2] == "b.c" and steps[1][2] == "c.cpp"  # the file compiled
    assert steps[-1][2] == "linking libtinya.so"


def test_progress_from_cmake_make() -> None:
    seen = [p for p in lw.read_progress(MAKE_LOG.read_text().splitlines()) if p.total]
    assert seen[0].step == "ggml.c" and seen[-1].fraction == 1.0
    done = [p.done for p in seen]
    assert done == sorted(done)  # make's percentages only go up
    assert any(p.step.startswith("linking ") for p in seen)


def test_render_shows_bar_step_and_an_estimate() -> None:
    line = lw.render(lw.Progress(lw.COMPILING, 45, 180, "ggml-cpu.c"), elapsed=150)
    assert "[######..................]  25% 45/180  ggml-cpu.c" in line
    assert "(2m30s, about 7m30s left)" in line
    early = lw.render(lw.Progress(lw.COMPILING, 5, 180, "ggml.c"), elapsed=10)
    assert "left" not in early  # too early to guess
    assert lw.render(lw.Progress("configuring (cmake)"), 3) == "  configuring (cmake)... (0m03s)"


def test_display_keeps_a_log_short_and_redraws_a_terminal() -> None:
    progress = list(lw.read_progress(MAKE_LOG.read_text().splitlines()))
    log = io.StringIO()
    shown = lw.Display(log, tty=False)
    for p in progress:
        shown.show(p)
    lines = log.getvalue().splitlines()
    assert len(progress) > 200 and 10 <= len(lines) <= 13  # a phase, then each tenth
    term = io.StringIO()
    redrawn = lw.Display(term, tty=True)
    for p in progress[:3]:
        redrawn.show(p)
    redrawn.end()
    assert term.getvalue().count("\r\033[K") == 3 and term.getvalue().endswith("\n")


def test_build_key_and_flags() -> None:
    cpu = lw.build_key("")
    assert cpu == lw.build_key("  ") == f"cpu-{lw.PATCH_TAG}" != "cpu"  # not upstream's
    assert lw.build_key(" -DGGML_CUDA=on") == lw.build_key("-DGGML_CUDA=on") != cpu
    assert lw.build_key("-DGGML_CUDA=on") != lw.build_key("-DGGML_VULKAN=on")


def test_a_wheel_is_reused_only_where_its_flags_and_patch_match(tmp_path: Path) -> None:
    folder = tmp_path / "cpu"
    folder.mkdir()
    upstream = folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    upstream.write_bytes(b"wheel")  # an earlier build, without the patch: never reused
    assert lw.cached_wheel(folder, "0.3.36", "") is None
    (folder / WHEEL).write_bytes(b"wheel")
    assert lw.cached_wheel(folder, "0.3.36", "") is None  # no record of its patch
    (folder / lw.FLAGS_FILE).write_text(f"patch={lw.PATCH_TAG}\n")
    assert lw.cached_wheel(folder, "0.3.36", "") == folder / WHEEL
    assert lw.cached_wheel(folder, "0.3.37", "") is None
    (folder / lw.FLAGS_FILE).write_text(f"-DGGML_CUDA=on patch={lw.PATCH_TAG}\n")
    assert lw.cached_wheel(folder, "0.3.36", "") is None
    assert lw.cached_wheel(folder, "0.3.36", "-DGGML_CUDA=on") == folder / WHEEL


def _sdist(tmp_path: Path) -> Path:
    """A stand-in for the pinned sdist: the two files the build patches, as upstream
    ships them."""
    root = tmp_path / "sdist" / "llama_cpp_python-0.3.36"
    texts: dict[str, str] = {}
    for name, upstream, _ in lw.SOURCE_PATCHES:
        texts[name] = texts.get(name, "// upstream\n") + upstream
    texts["llama_cpp/__init__.py"] = 'from .llama_cpp import *\n\n__version__ = "0.3.36"\n'
    for name, text in texts.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    out = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(root, arcname=root.name)
    return out


def test_the_source_is_patched_once_or_the_build_stops(tmp_path: Path) -> None:
    sdist = _sdist(tmp_path)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    source = tmp_path / "x" / "llama_cpp_python-0.3.36"
    lw.patch_source(source)
    ops = (source / lw.SOURCE_PATCHES[0][0]).read_text()
    assert "tiled<16>(params" in ops and "neq1 >= 8);" in ops and "neq1 >= Q_TILE_SZ);" not in ops
    init = (source / "llama_cpp/__init__.py").read_text()
    assert f'__version__ = "0.3.36+warmstart.{lw.PATCH_TAG}"' in init
    with pytest.raises(SystemExit, match="is not the one warmstart patches"):
        lw.patch_source(source)  # patched already: upstream's text is gone


def _fake_pip(tmp_path: Path, code: int) -> Path:
    """A 'python' whose `-m pip download ... -d DIR` leaves a stand-in sdist in DIR, and
    whose `-m pip wheel ... -w DIR SOURCE` says whether SOURCE was patched, replays the
    recorded build and leaves a wheel in DIR, or fails."""
    sdist = _sdist(tmp_path)
    script = tmp_path / "python"
    script.write_text(f"""#!/bin/sh
if [ "$3" = download ]; then
  while [ "$1" != -d ]; do shift; done
  cp {sdist} "$2/"
  echo "Collecting llama-cpp-python==0.3.36"
  exit 0
fi
while [ "$1" != -w ]; do shift; done
grep -q "tiled<16>" "$3/{lw.SOURCE_PATCHES[0][0]}" && echo "SOURCE PATCHED"
cat {NINJA_LOG}
echo "CMAKE_ARGS=[$CMAKE_ARGS]"
[ {code} = 0 ] || exit {code}
echo built >"$2/{WHEEL}"
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_compiles_once_into_the_cache_then_reuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    python = str(_fake_pip(tmp_path, 0))
    out = io.StringIO()
    wheel = lw.ensure_wheel("0.3.36", " -DGGML_VULKAN=on ", python, out)
    folder = tmp_path / ".cache/warmstart/llama-wheels" / lw.build_key("-DGGML_VULKAN=on")
    assert wheel == folder / WHEEL and wheel.read_text() == "built\n"
    assert (folder / lw.FLAGS_FILE).read_text() == f"-DGGML_VULKAN=on patch={lw.PATCH_TAG}\n"
    log = (folder / "build.log").read_text()
    assert "Collecting llama-cpp-python==0.3.36" in log and "SOURCE PATCHED" in log
    assert "CMAKE_ARGS=[-DGGML_VULKAN=on]" in log
    said = out.getvalue()
    assert "0.3.36 with -DGGML_VULKAN=on: longer than the CPU build's 10-20 min on 2" in said
    assert "100% 7/7  linking libtinya.so" in said and "==> compiled in" in said
    assert sorted(os.listdir(folder)) == sorted([WHEEL, lw.FLAGS_FILE, "build.log"])

    again = io.StringIO()
    assert lw.ensure_wheel("0.3.36", "-DGGML_VULKAN=on", "/nonexistent", again) == wheel
    assert again.getvalue().startswith("==> reusing the compiled llama-cpp-python 0.3.36")


def test_a_failed_compile_shows_its_tail_and_leaves_no_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    out = io.StringIO()
    with pytest.raises(SystemExit, match="did not compile; the whole output is in"):
        lw.ensure_wheel("0.3.36", "", str(_fake_pip(tmp_path, 1)), out)
    folder = tmp_path / "xdg/warmstart/llama-wheels" / lw.build_key("")
    assert os.listdir(folder) == ["build.log"]  # no wheel, no half-built folder
    assert "Successfully built tinyc" in out.getvalue()  # the log's tail


def test_key_on_the_command_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CMAKE_ARGS", "")
    assert lw.main(["--key"]) == 0
    assert capsys.readouterr().out == f"cpu-{lw.PATCH_TAG}\n"


def test_a_wheel_built_under_sudo_goes_to_the_owner_of_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sudo installers/linux/install-server.sh` where sudo keeps the user's HOME."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, 65534, 65534)  # nobody
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    wheel = lw.ensure_wheel("0.3.36", "", str(_fake_pip(tmp_path, 0)), io.StringIO())
    made = [wheel, *wheel.parent.iterdir(), *wheel.parents]
    assert {p.stat().st_uid for p in made if p.is_relative_to(home)} == {65534}
