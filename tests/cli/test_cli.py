"""The `warmstart` command line, run as a user would (real processes, real model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "--n-ctx",
    "1024",
    "--resident-sequences",
    "2",
    "--chunk-tokens",
    "32",
    "--ram-pool-bytes",
    str(64 << 20),
    "--prewarm-sessions",
    "0",
]


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory, model_path: Path):  # type: ignore[no-untyped-def]
    data_dir = tmp_path_factory.mktemp("cli")

    def run(
        *args: str, stdin: str | None = None, env: dict[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        # the test's own flags come last, so they win over the common ones
        cmd = [
            sys.executable,
            "-m",
            "runtime.cli",
            args[0],
            "--data-dir",
            str(data_dir),
            "--model",
            str(model_path),
            *SMALL,
            *args[1:],
        ]
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        proc = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, env=full_env, timeout=300
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    return run


def test_doctor_json_has_every_threshold_with_a_reason(cli) -> None:  # type: ignore[no-untyped-def]
    report = json.loads(cli("doctor", "--json").stdout)
    assert set(report) == {"model", "hardware", "calibration", "settings"}
    assert report["model"]["name"] == "smollm2-135m"  # its name, not only a hash
    for name in (
        "swap_in_threshold_tokens",
        "ram_pool_bytes",
        "disk_budget_bytes",
        "chunk_tokens",
        "high_watermark",
        "low_watermark",
        "zstd_level",
        "resident_sequences",
        "n_ctx",
        "prewarm_sessions",
    ):
        assert report["settings"][name]["reason"], name
    assert report["settings"]["chunk_tokens"] == {"value": 32, "reason": "set by the user"}
    extra = report["settings"]["extra_buffers"]  # the smoke decode's verdict, and why
    assert extra["value"] in ("on", "off") and "smoke decode" in extra["reason"]
    assert report["hardware"]["llama_cpp"]["backends"]
    again = json.loads(cli("doctor", "--json").stdout)
    assert again["calibration"]["reused"] is True  # a second start measures nothing


def test_doctor_text_names_the_model_fits_100_columns_and_talks_at_once(cli) -> None:  # type: ignore[no-untyped-def]
    """Off a terminal (here: pipes) doctor says at once what it does, then each step of
    the calibration, and its report fits 100 columns; the extra-buffer choice is a fact
    of the model's, never a WARNING."""
    proc = cli("doctor", "--recalibrate")
    first = proc.stderr.splitlines()[0]
    assert first.startswith("warmstart doctor: loading"), proc.stderr
    steps = [line for line in proc.stderr.splitlines() if line.startswith("calibrating: ")]
    assert len({line.split(" (")[0] for line in steps}) >= 6, proc.stderr
    assert any("prefill: " in line and "tokens" in line for line in steps)  # inside the first
    assert "WARNING" not in proc.stderr and "\r" not in proc.stderr
    out = proc.stdout.splitlines()
    model = out.index("Model")
    assert out[model + 1].split()[0] == "smollm2-135m"
    assert out[model + 2].startswith("  extra buffer types: o")
    for line in out:  # a longer line is one unbreakable word (a path)
        assert len(line) <= 100 or max(len(w) for w in line.split()) > 40, line
    assert max(len(line) for line in out) > 60  # the lines were not cut to nothing


def test_ask_twice_reports_the_cache_and_no_cache_does_not(cli) -> None:  # type: ignore[no-untyped-def]
    q = "Name the largest planet. One sentence."
    first = cli("ask", q, "--max-tokens", "12")
    second = cli("ask", q, "--max-tokens", "12")
    assert first.stdout == second.stdout and first.stdout.strip()
    assert "from disk" in second.stderr and "TTFT" in second.stderr
    off = cli("ask", q, "--max-tokens", "12", env={"WARMSTART_NO_CACHE": "1"})
    assert off.stdout == first.stdout and "from " not in off.stderr


def test_chat_persists_and_resumes(cli) -> None:  # type: ignore[no-untyped-def]
    cli("chat", "--session", "trip", "--max-tokens", "8", stdin="Plan a trip to Rome.\n")
    resumed = cli("chat", "--session", "trip", "--max-tokens", "8", stdin="And Paris?\n/list\n")
    assert "resumed trip" in resumed.stderr and "(3 messages" in resumed.stderr
    assert "from disk" in resumed.stderr  # the earlier turn's prefix came back
    shown = cli("sessions", "show", "trip").stdout
    assert "Plan a trip to Rome." in shown and "And Paris?" in shown
    assert "trip" in cli("sessions", "list").stdout
    assert "deleted" in cli("sessions", "delete", "trip").stdout
    assert cli("sessions", "show", "trip", check=False).returncode == 1


def test_cache_stats_clear_and_models_list(cli) -> None:  # type: ignore[no-untyped-def]
    cli("ask", "Say hello.", "--max-tokens", "4")
    stats = json.loads(cli("cache", "stats", "--json").stdout)
    assert stats["tiers"]["disk"]["tokens"] > 0
    table = cli("cache", "stats").stdout  # for people: a table, the same figures
    disk = next(line for line in table.splitlines() if line.strip().startswith("disk"))
    assert f"{stats['tiers']['disk']['tokens']:,}" in disk
    assert "cache cleared" in cli("cache", "clear").stdout
    assert json.loads(cli("cache", "stats", "--json").stdout)["tiers"]["disk"]["tokens"] == 0


def test_bad_setting_is_a_clear_error(cli) -> None:  # type: ignore[no-untyped-def]
    proc = cli("ask", "hi", "--chunk-tokens", "3", check=False)
    assert proc.returncode == 2 and "chunk_tokens" in proc.stderr
    proc = cli("ask", "hi", env={"WARMSTART_ZSTD_LEVEL": "99"}, check=False)
    assert proc.returncode == 2 and "zstd_level" in proc.stderr
    proc = cli("ask", "hi", "--model", "/nonexistent.gguf", check=False)
    assert proc.returncode == 2 and "no model" in proc.stderr


def test_app_options_reach_the_app(capsys: pytest.CaptureFixture[str]) -> None:
    from warmstart.runtime.cli._main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["app", "--theme", "dark", "--help"])
    assert exit_info.value.code == 0
    assert "--server URL" in capsys.readouterr().out  # the app's own parser answered
