"""`warmstart bench --replies`: the rows, batched and one at a time side by side, on
the fake engine (the logic, not the figures), the report, and the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from warmstart.runtime.bench import _replies
from warmstart.runtime.engine import FakeOptions

from tests.conftest import fake_runtime


def test_each_count_runs_batched_and_one_at_a_time(tmp_path: Path) -> None:
    """Counted, not timed: the batched runs share decode steps, the serial ones none,
    and every reply decodes its whole length (its end-of-turn token banned)."""
    options = FakeOptions(token_delay=0.002)
    with fake_runtime(tmp_path, options, resident_sequences=4, decode_batch=4) as rt:
        rows = _replies.measure_replies(rt, (1, 2, 4), max_tokens=12, rounds=2)
        assert rt.worker._decode_batch == 4  # set back after the serial runs
    assert [r["replies"] for r in rows] == [1, 2, 4]
    assert "serial" not in rows[0]  # one reply: nothing to compare
    for row in rows[1:]:
        assert row["batched"]["shared_steps"] > 0 and row["serial"]["shared_steps"] == 0
        assert row["batched"]["together_tok_s"] > 0 and row["serial"]["per_reply_tok_s"] > 0
    text = _replies.render_replies(
        {"decode_batch": 4, "decode_batch_reason": "set", "reply_tokens": 12, "rounds": 2,
         "rows": rows}
    )  # fmt: skip
    assert "12-token replies, median of 2 rounds; decode_batch 4 (set)" in text
    assert len(text.splitlines()) == 2 + 3


def test_the_reply_counts_are_checked_on_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from warmstart.runtime.cli._parser import build_parser

    parser = build_parser()
    args = parser.parse_args(["bench", "--replies", "1,2,4,8", "--quick"])
    assert args.replies == (1, 2, 4, 8) and args.reply_tokens is None
    for bad in ("0,2", "two", ""):
        with pytest.raises(SystemExit):
            parser.parse_args(["bench", "--replies", bad])
        assert "expected numbers 1 to 64" in capsys.readouterr().err
