"""The loader verdict: a smoke load in a child proves mmap, pinned staging and offload
before the serving process uses them, falling back one step at a time when the child
dies by a signal; the verdict is cached, settings override it, doctor explains it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from warmstart.runtime.cli._doctor import doctor_report, render_doctor
from warmstart.runtime.engine._loader import (
    NO_PINNED_ENV,
    LoaderChoice,
    choose_loader,
    fallbacks,
    requested,
)
from warmstart.runtime.errors import ModelError
from warmstart.runtime.policy import choose
from warmstart.runtime.settings import load_settings

from tests.conftest import small_settings
from tests.hardware.machines import LLAMA_8B, MACHINES


def _dies_unless(code: str) -> list[str]:
    """A child that lives when ``code`` (a Python expression on its environment) holds,
    and dies by SIGSEGV otherwise, without a core file."""
    return [
        sys.executable,
        "-c",
        "import os, resource, signal; resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
        f"if not ({code}): os.kill(os.getpid(), signal.SIGSEGV)",
    ]


def _never(*_args: object) -> list[str]:
    raise AssertionError("the loader smoke child must not run")


def _choose(tmp_path: Path, command, **kw):  # type: ignore[no-untyped-def]
    args = dict(
        mmap="auto",
        pinned="auto",
        n_gpu_layers=-1,
        model=tmp_path / "m.gguf",
        digest="d",
        extra_buffers=False,
        cache_file=tmp_path / "loader.json",
        gpu_offload=True,
        command=command,
    )
    args.update(kw)
    return choose_loader(**args)  # type: ignore[arg-type]


def test_the_chain_steps_one_choice_at_a_time_and_keeps_set_ones() -> None:
    first = requested("auto", "auto", -1)
    chain = fallbacks(first, "auto", "auto")
    assert [(c.mmap, c.pinned, c.n_gpu_layers) for c in chain] == [
        (None, True, -1),
        (False, True, -1),
        (False, False, -1),
        (False, False, 0),
    ]
    forced = fallbacks(requested("on", "on", 20), "on", "on")
    assert [(c.mmap, c.pinned, c.n_gpu_layers) for c in forced] == [
        (True, True, 20),
        (True, True, 0),
    ]
    assert fallbacks(requested("off", "off", 0), "off", "off") == [requested("off", "off", 0)]


def test_the_configured_choice_is_kept_when_its_child_lives(tmp_path: Path) -> None:
    choice = _choose(tmp_path, lambda m, c, e: _dies_unless("True"))
    assert (choice.mmap, choice.pinned, choice.n_gpu_layers) == (None, True, -1)
    assert choice.reason == "a smoke load and decode passed"


def test_a_death_with_mmap_reads_the_file_instead_and_is_cached(tmp_path: Path) -> None:
    def command(_model: Path, choice: LoaderChoice, _extra: bool) -> list[str]:
        return _dies_unless(repr(choice.mmap is False))

    choice = _choose(tmp_path, command)
    assert (choice.mmap, choice.pinned, choice.n_gpu_layers) == (False, True, -1)
    assert "died by SIGSEGV" in choice.reason and "mmap auto" in choice.reason
    assert _choose(tmp_path, _never) == choice  # cached: no child the next time
    assert len(json.loads((tmp_path / "loader.json").read_text())["entries"]) == 1
    # another model, or other settings, are other questions
    other = _choose(tmp_path, lambda m, c, e: _dies_unless("True"), digest="e")
    assert other.mmap is None


def test_pinned_staging_off_reaches_the_child_as_its_environment(tmp_path: Path) -> None:
    # this child dies unless ggml-cuda would see GGML_CUDA_NO_PINNED
    choice = _choose(tmp_path, lambda m, c, e: _dies_unless(f"os.environ.get({NO_PINNED_ENV!r})"))
    assert (choice.mmap, choice.pinned, choice.n_gpu_layers) == (False, False, -1)
    assert choice.env() == {NO_PINNED_ENV: "1"}
    assert choice.reason.count("died by SIGSEGV") == 2


def test_offload_zero_is_the_last_step(tmp_path: Path) -> None:
    def command(_model: Path, choice: LoaderChoice, _extra: bool) -> list[str]:
        return _dies_unless(repr(choice.n_gpu_layers == 0))

    choice = _choose(tmp_path, command)
    assert (choice.mmap, choice.pinned, choice.n_gpu_layers) == (False, False, 0)
    assert choice.reason.count("died by SIGSEGV") == 3


def test_when_every_choice_dies_loading_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"every way to load m\.gguf killed") as err:
        _choose(tmp_path, lambda m, c, e: _dies_unless("False"))
    assert "CUDA_VISIBLE_DEVICES=" in str(err.value)
    assert not (tmp_path / "loader.json").exists()


def test_an_ordinary_failure_stops_the_chain_uncached(tmp_path: Path) -> None:
    fails = [sys.executable, "-c", "import sys; sys.exit('no memory')"]
    choice = _choose(tmp_path, lambda m, c, e: fails)
    assert (choice.mmap, choice.n_gpu_layers) == (None, -1) and "exit 1" in choice.reason
    assert "no memory" in choice.reason and not (tmp_path / "loader.json").exists()


def test_nothing_to_prove_runs_no_child(tmp_path: Path) -> None:
    cpu_build = _choose(tmp_path, _never, gpu_offload=False)
    assert cpu_build.n_gpu_layers == -1 and "CPU-only" in cpu_build.reason
    no_offload = _choose(tmp_path, _never, n_gpu_layers=0, mmap="off", pinned="off")
    assert (no_offload.mmap, no_offload.pinned) == (False, False)
    assert "nothing to prove" in no_offload.reason
    assert not (tmp_path / "loader.json").exists()


def test_the_choice_applies_to_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NO_PINNED_ENV, "1")
    LoaderChoice(pinned=True).apply_env()
    assert NO_PINNED_ENV not in __import__("os").environ
    LoaderChoice(pinned=False).apply_env()
    assert __import__("os").environ[NO_PINNED_ENV] == "1"
    roundtrip = LoaderChoice(False, False, 3, "why")
    assert LoaderChoice.from_dict(json.loads(json.dumps(roundtrip.to_dict()))) == roundtrip


def test_doctor_explains_the_loader() -> None:
    profile = MACHINES[sorted(MACHINES)[0]]
    tuning = choose(profile, None, LLAMA_8B, load_settings())
    why = "a smoke load and decode passed after mmap auto, ... died by SIGSEGV"
    loader = LoaderChoice(False, True, -1, why)
    report = doctor_report(profile, None, tuning, loader=loader)
    assert report["settings"]["loader"] == {
        "value": "mmap off, pinned staging on, layers offloaded all",
        "reason": why,
    }
    assert why in render_doctor(report)


@pytest.mark.slow
def test_the_runtime_loads_as_the_verdict_says(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real model, through load_model, with a fake GPU build whose child dies with
    mmap: the serving process then reads the file and keeps pinned staging."""
    from warmstart.runtime.serving._load import load_model

    monkeypatch.delenv(NO_PINNED_ENV, raising=False)

    def command(_model: Path, choice: LoaderChoice, _extra: bool) -> list[str]:
        return _dies_unless(repr(choice.mmap is False))

    settings = small_settings(tmp_path / "data", model_path)
    loaded = load_model(settings, loader_smoke=command, gpu_offload=True)
    try:
        assert loaded.loader.mmap is False and loaded.model.mmap is False
        assert loaded.model.n_gpu_layers == loaded.loader.n_gpu_layers
        assert loaded.model.tokenize("hi", add_special=False)
    finally:
        loaded.model.close()


@pytest.mark.slow
def test_the_real_loader_child_lives_here(tmp_path: Path, model_path: Path) -> None:
    from warmstart.runtime.engine._loader import smoke_load

    for choice in (LoaderChoice(), LoaderChoice(mmap=False, pinned=False, n_gpu_layers=0)):
        assert smoke_load(model_path, choice, False) == (None, True)
