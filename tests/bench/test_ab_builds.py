"""The two-builds benchmark: what build B is, the medians and ratios it prints, and
(slow) one tiny round on this venv's build against the build before it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from warmstart.runtime.bench import _ab_builds as ab
from warmstart.runtime.errors import PeerError

from installers.llama_patches import PATCH_TAG

SHORTTILES = Path.home() / ".cache" / "warmstart" / "llama-wheels" / "cpu-shorttiles1"


def test_build_b_is_an_install_or_one_wheel(tmp_path: Path) -> None:
    installed = tmp_path / "installed"
    (installed / "llama_cpp").mkdir(parents=True)
    assert ab.other_build(installed, tmp_path) == installed
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PeerError, match="not a llama_cpp install"):
        ab.other_build(empty, tmp_path)
    with pytest.raises(PeerError, match="not a llama_cpp install"):
        ab.other_build(tmp_path / "missing.whl", tmp_path)


def test_the_report_gives_medians_and_ratios() -> None:
    args = ab.parse_args(["--other", "/x", "--rounds", "3"])
    assert (args.context, args.decode, args.extra_buffers) == (1500, 128, False)

    def runs(build: str, prefill: list[float], tps: list[float]) -> list[dict[str, object]]:
        return [
            {"build": build, "prefill_s": p, "decode_tok_s": t}
            for p, t in zip(prefill, tps, strict=True)
        ]

    samples = {
        "A": runs("a", [10.0, 10.4, 99.0], [20.0, 19.0, 1.0]),
        "B": runs("b", [10.0, 10.0, 10.0], [20.0, 20.0, 20.0]),
    }
    text = ab.render(samples, args)
    assert "A 10.400 s, B 10.000 s, A / B 1.040" in text
    assert "A 19.00 tok/s, B 20.00 tok/s, A / B 0.950" in text
    assert "A: a (this environment); B: b (/x)" in text


@pytest.mark.slow
@pytest.mark.skipif(not SHORTTILES.is_dir(), reason="no shorttiles1 wheel in the cache")
def test_one_tiny_round_runs_on_both_builds(
    model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--other", str(SHORTTILES), "--model", str(model_path), "--context", "64"]
    assert ab.main([*argv, "--decode", "4", "--rounds", "1"]) == 0
    out = capsys.readouterr()
    assert "shorttiles1" in out.out and PATCH_TAG in out.out, out.err[-2000:]
    assert "cold prefill of 64 tokens" in out.out and sys.executable
