"""Extra buffer types: a smoke decode in a child decides, a death by a signal turns them
off (with the reason recorded), the verdict is cached, and the runtime still answers."""

from __future__ import annotations

import json
import logging
import signal
import stat
import sys
from pathlib import Path

import pytest
from warmstart.runtime.cli._doctor import doctor_report, render_doctor
from warmstart.runtime.engine._smoke import (
    ExtraBuffers,
    VerdictCache,
    choose_extra_buffers,
    machine_key,
    smoke_test,
)
from warmstart.runtime.hardware import HardwareProfile
from warmstart.runtime.policy import choose
from warmstart.runtime.settings import load_settings

from tests.conftest import chat, small_settings
from tests.hardware.machines import LLAMA_8B, MACHINES


def _dies_by(sig: signal.Signals) -> list[str]:
    # no core file: the death is the expected answer
    code = (
        "import os, resource, signal; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
        f"os.kill(os.getpid(), signal.{sig.name})"
    )
    return [sys.executable, "-c", code]


def _never(_model: Path) -> list[str]:
    raise AssertionError("the smoke child must not run")


def _exits(code: int, message: str = "") -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.stderr.write({message!r}); sys.exit({code})"]


# the verdict cache ----------------------------------------------------------------------------
def test_cache_roundtrip_private_and_atomic(tmp_path: Path) -> None:
    cache = VerdictCache(tmp_path / "d" / "extra_buffers.json")
    assert cache.get("k") is None
    cache.put("k", ExtraBuffers(False, "died by SIGILL"))
    cache.put("other", ExtraBuffers(True, "passed"))
    assert cache.get("k") == ExtraBuffers(False, "died by SIGILL")
    assert cache.get("other") == ExtraBuffers(True, "passed")
    assert stat.S_IMODE(cache.path.stat().st_mode) == 0o600
    assert [p.name for p in cache.path.parent.iterdir()] == ["extra_buffers.json"]


@pytest.mark.parametrize("content", ["{not json", '{"format": 99, "entries": {}}', "[]"])
def test_corrupt_or_foreign_cache_reads_as_empty_and_is_rewritten(
    tmp_path: Path, content: str
) -> None:
    path = tmp_path / "extra_buffers.json"
    path.write_text(content)
    cache = VerdictCache(path)
    assert cache.get("k") is None
    cache.put("k", ExtraBuffers(True, "passed"))
    assert cache.get("k") == ExtraBuffers(True, "passed")


def test_setting_on_or_off_never_runs_the_child(tmp_path: Path) -> None:
    model, cache = tmp_path / "m.gguf", tmp_path / "v.json"
    on = choose_extra_buffers("on", model, "d", cache, _never)
    off = choose_extra_buffers("off", model, "d", cache, _never)
    assert on == ExtraBuffers(True, "set by extra_buffers=on")
    assert off == ExtraBuffers(False, "set by extra_buffers=off")
    assert not cache.exists()


def test_a_death_by_signal_is_cached_per_machine_and_model(tmp_path: Path) -> None:
    model, cache = tmp_path / "m.gguf", tmp_path / "v.json"
    sigill = lambda _m: _dies_by(signal.SIGILL)  # noqa: E731
    first = choose_extra_buffers("auto", model, "digest-a", cache, sigill)
    assert not first.enabled and "died by SIGILL" in first.reason and "AMX" in first.reason
    assert choose_extra_buffers("auto", model, "digest-a", cache, _never) == first
    entries = json.loads(cache.read_text())["entries"]
    assert list(entries) == [f"{machine_key()}/digest-a"]
    # another model is another question
    other = choose_extra_buffers("auto", model, "digest-b", cache, lambda _m: _exits(0))
    assert other.enabled and "passed" in other.reason


def test_other_signals_are_named(tmp_path: Path) -> None:
    verdict, conclusive = smoke_test(tmp_path / "m.gguf", lambda _m: _dies_by(signal.SIGSEGV))
    assert conclusive and not verdict.enabled and "SIGSEGV" in verdict.reason


def test_an_ordinary_failure_is_off_but_not_cached(tmp_path: Path) -> None:
    model, cache = tmp_path / "m.gguf", tmp_path / "v.json"
    verdict = choose_extra_buffers("auto", model, "d", cache, lambda _m: _exits(3, "no memory"))
    assert not verdict.enabled and "exit 3" in verdict.reason and "no memory" in verdict.reason
    assert not cache.exists()  # the next start tries again


def test_a_hang_is_off_but_not_cached(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    verdict, conclusive = smoke_test(tmp_path / "m.gguf", lambda _m: sleeper, timeout_s=0.5)
    assert not verdict.enabled and "hung" in verdict.reason and not conclusive


# doctor -----------------------------------------------------------------------------------------
def test_doctor_states_the_choice_and_its_reason() -> None:
    profile: HardwareProfile = MACHINES[sorted(MACHINES)[0]]
    tuning = choose(profile, None, LLAMA_8B, load_settings())
    why = "a smoke decode with llama.cpp's extra buffer types died by SIGILL (Intel AMX?)"
    build = {"backends": ["CPU"], "gpu_offload": False, "system_info": "CPU : AMX_INT8 = 1 |"}
    report = doctor_report(
        profile, None, tuning, extra_buffers=ExtraBuffers(False, why), llama_build=build
    )
    assert report["settings"]["extra_buffers"] == {"value": "off", "reason": why}
    assert json.loads(json.dumps(report))["hardware"]["llama_cpp"] == build
    text = render_doctor(report)
    assert "extra_buffers" in text and why in text
    assert "llama.cpp loaded: CPU (no GPU offload)" in text


# the real child and the real runtime -----------------------------------------------------------
def _has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.slow
def test_the_real_smoke_child_passes_here(model_path: Path) -> None:
    verdict, conclusive = smoke_test(model_path)
    assert conclusive
    if _has_amx():
        # Either answer is right there; what matters is that we are alive and that the
        # death, whichever fatal signal it was (SIGILL in one KVM guest, SIGSEGV in
        # another), turned extra buffers off with its reason.
        assert verdict.enabled or "died by SIG" in verdict.reason, verdict.reason
    else:
        assert verdict.enabled, verdict.reason


@pytest.mark.slow
def test_runtime_answers_without_extra_buffers_when_the_child_dies(
    tmp_path: Path, model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from warmstart.runtime.serving._factory import build_runtime
    from warmstart.runtime.serving._load import load_model

    settings = small_settings(tmp_path / "fresh", model_path)
    (tmp_path / "fresh" / "extra_buffers.json").unlink(missing_ok=True)  # decide afresh
    caplog.set_level(logging.INFO)  # a fact, said at INFO: not a warning (issue 22)
    loaded = load_model(settings, smoke=lambda _m: _dies_by(signal.SIGILL))
    assert loaded.extra_buffers.enabled is False
    assert loaded.model.extra_buffers is False  # what llama.cpp was actually given
    assert "died by SIGILL" in loaded.extra_buffers.reason
    assert "extra buffer types: off (a smoke decode" in caplog.text
    said = [r for r in caplog.records if "extra buffer types" in r.getMessage()]
    assert said and all(r.levelno == logging.INFO for r in said)
    with build_runtime(settings, loaded) as rt:
        text, report = rt.generate(chat("What colour is the sky? One word.", max_tokens=8)).text()
    assert text.strip() and report.completion_tokens > 0
    # the verdict is kept: the next start neither runs the child nor turns them on
    again = load_model(settings, smoke=_never)
    try:
        assert again.extra_buffers == loaded.extra_buffers and not again.model.extra_buffers
    finally:
        again.model.close()


@pytest.mark.slow
@pytest.mark.parametrize("extra", [False, True])
def test_bench_comparison_child_obeys_the_choice(model_path: Path, extra: bool) -> None:
    """llama-cpp-python's Llama builds its own model params: the bench's child makes
    them say what the smoke test said (in a process of its own: it patches a module)."""
    import subprocess

    code = (
        "import sys; from pathlib import Path; from warmstart.runtime.bench._lcp import _llama; "
        f"llm = _llama(Path(sys.argv[1]), 256, {extra}, 0); "
        "print(llm.model_params.use_extra_bufts); llm.close()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(model_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == str(extra)
