"""warmstart doctor: one JSON object and a text rendering of it."""

from __future__ import annotations

import io
import json

import pytest
from warmstart.runtime.cli._doctor import ProgressLine, doctor_report, render_doctor
from warmstart.runtime.engine._smoke import ExtraBuffers
from warmstart.runtime.hardware import HardwareProfile
from warmstart.runtime.policy import choose
from warmstart.runtime.settings import load_settings

from tests.hardware.machines import LLAMA_8B, MACHINES, calibration_for

REQUIRED = {
    "swap_in_threshold_tokens", "ram_pool_bytes", "disk_budget_bytes", "chunk_tokens",
    "high_watermark", "low_watermark", "zstd_level", "resident_sequences", "n_ctx",
    "prewarm_sessions", "memory_floor_bytes",
}  # fmt: skip


pytestmark = pytest.mark.usefixtures("clean_settings")


def _report(profile: HardwareProfile, measured: bool, reused: bool | None = None) -> dict:
    cal = calibration_for(profile) if measured else None
    tuning = choose(profile, cal, LLAMA_8B, load_settings())
    return doctor_report(profile, cal, tuning, calibration_reused=reused)


@pytest.mark.parametrize("measured", [True, False])
@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_json_shape(machine: str, measured: bool) -> None:
    report = json.loads(json.dumps(_report(MACHINES[machine], measured)))
    assert set(report) == {"hardware", "calibration", "settings"}
    assert set(report["settings"]) >= REQUIRED
    for entry in report["settings"].values():
        assert set(entry) == {"value", "reason"} and entry["reason"]
    assert report["hardware"]["machine_id"] == MACHINES[machine].machine_id()
    assert (report["calibration"] is None) != measured
    if measured:
        assert report["calibration"]["prefill_tps"] > 0 and report["calibration"]["zstd"]


@pytest.mark.parametrize("measured", [True, False])
@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_text_shows_every_figure_and_reason(machine: str, measured: bool) -> None:
    report = _report(MACHINES[machine], measured, reused=True)
    text = render_doctor(report)
    for name, entry in report["settings"].items():
        assert name in text and entry["reason"] in text
    assert ("reused from cache" in text) == measured
    assert ("not measured" in text) != measured
    gpus = MACHINES[machine].gpus
    assert (gpus[0].name if gpus else "none (CPU inference)") in text


def test_user_settings_say_so() -> None:
    profile = MACHINES["laptop"]
    tuning = choose(profile, None, LLAMA_8B, load_settings(chunk_tokens=128))
    text = render_doctor(doctor_report(profile, None, tuning))
    assert "set by the user" in text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_and_quiet_otherwise() -> None:
    # issue 11: the old bar wrote carriage returns into logs; off a terminal it is quiet
    piped = io.StringIO()
    progress = ProgressLine(piped)
    progress("prefill", 0.0)
    progress("done", 1.0)
    assert piped.getvalue() == ""
    term = _Terminal()
    progress = ProgressLine(term)
    progress("prefill", 0.0)
    progress("done", 1.0)
    assert "calibrating" in term.getvalue() and "100%" in term.getvalue()


def test_the_memory_floor_line_says_its_size_and_why() -> None:
    text = render_doctor(_report(MACHINES["laptop"], True))
    line = next(x for x in text.splitlines() if "memory_floor_bytes" in x)
    assert "GiB)" in line and "gives their pages back" in line
    h100 = render_doctor(_report(MACHINES["h100"], True))
    assert "pinned pages can be neither swapped nor given back" in h100


def test_progress_lines_for_doctor_off_a_terminal() -> None:
    """doctor's progress off a terminal: a plain line a step (no carriage return), so a
    pipe or a file shows it is working; on a terminal the bar as before."""
    piped = io.StringIO()
    progress = ProgressLine(piped, lines=True)
    progress("prefill: 64 tokens", 0.1)
    progress("done", 1.0)
    assert piped.getvalue() == "calibrating: prefill: 64 tokens (10%)\ncalibrating: done (100%)\n"
    term = _Terminal()
    ProgressLine(term, lines=True)("prefill", 0.0)
    assert "calibrating: prefill (0%)\n" not in term.getvalue()


@pytest.mark.parametrize("width", [100, 60])
def test_text_names_the_model_and_wraps_to_the_width(width: int) -> None:
    profile = MACHINES["laptop"]
    cal = calibration_for(profile)
    tuning = choose(profile, cal, LLAMA_8B, load_settings())
    report = doctor_report(
        profile,
        cal,
        tuning,
        extra_buffers=ExtraBuffers(False, "a smoke decode died by SIGSEGV here"),
        model={"name": "smollm2-135m", "path": "/m/SmolLM2-135M-Instruct.Q4_1.gguf"},
    )
    text = render_doctor(report, width)
    lines = text.splitlines()
    assert lines[:2] == ["Model", "  smollm2-135m  /m/SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert lines[2].startswith("  extra buffer types: off (a smoke decode died by")
    assert "smollm2-135m (fingerprint" in text
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    words = " ".join(text.split())
    for entry in report["settings"].values():  # every reason whole, only cut at spaces
        assert " ".join(entry["reason"].split()) in words
    unwrapped = render_doctor(report)
    assert max(len(line) for line in unwrapped.splitlines()) > 100  # what it was
