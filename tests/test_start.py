"""A quick start: the KV geometry is measured once, with the calibration, and a fresh
`warmstart ask` of a repeated question reaches its first token without a probe decode."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from warmstart.runtime import bench
from warmstart.runtime.engine._engine import Engine

from tests.conftest import chat, small_settings

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _clean_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("WARMSTART_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("WARMSTART_CONFIG", str(tmp_path / "absent.toml"))


def test_a_calibrated_start_measures_no_kv_geometry(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from warmstart.runtime.factory import open_runtime

    settings = small_settings(tmp_path, model_path, prewarm_sessions=0)
    with open_runtime(settings, prewarm=False) as rt:  # calibrates, measuring the geometry
        measured = (rt.engine.kv_bytes_per_token, rt.engine.kv_overhead_bytes)

    def probe(_self: Engine) -> tuple[int, int]:
        raise AssertionError("a calibrated start must not decode to measure the KV geometry")

    monkeypatch.setattr(Engine, "_measure_kv_geometry", probe)
    with open_runtime(settings, prewarm=False) as rt:
        assert (rt.engine.kv_bytes_per_token, rt.engine.kv_overhead_bytes) == measured
        text, report = rt.generate(chat("Name a colour. One word.", max_tokens=4)).text()
        assert text.strip() and report.completion_tokens > 0

        def blob_sizes() -> list[tuple[int, int]]:
            # the kept geometry still bounds the real blobs of this context
            eng, res = rt.engine, max(rt.engine.residents, key=lambda r: len(r.tokens))
            out = np.empty(eng.ctx.state_size(res.seq), dtype=np.uint8)
            return [(eng.ctx.state_get_into(res.seq, out), eng.blob_bytes(len(res.tokens)))]

        for real, bound in rt._call(blob_sizes):
            assert real <= bound < real + 4096


def test_cli_flags_reproduce_the_settings(tmp_path: Path, model_path: Path) -> None:
    from warmstart.runtime.cli import build_parser, settings_from

    settings = small_settings(tmp_path, model_path, cors_origins=("http://a", "http://b"))
    args = build_parser().parse_args(["ask", "q", *bench._cli_flags(settings)])
    assert settings_from(args) == settings


def test_a_fresh_ask_of_a_repeated_question(tmp_path: Path, model_path: Path) -> None:
    settings = small_settings(tmp_path, model_path, prewarm_sessions=0)
    asks = bench.repeated_ask(settings)
    first, repeat = asks["first"], asks["repeat"]
    assert "from disk" in repeat["summary"] and "TTFT" in repeat["summary"]
    assert "from disk" not in first["summary"]
    # the figure itself is printed by `warmstart bench --json`; on a shared, loaded
    # machine only its order of magnitude is a fair assertion
    assert 0 < repeat["process_start_to_first_token_s"] < min(first["process_wall_s"], 60)
    print(f"process start to first token: {repeat['process_start_to_first_token_s']:.2f} s")
