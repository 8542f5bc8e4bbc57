"""The paste scenario's benchmarks (issue 40): `warmstart bench --paste` in-process and
`make bench-peers --paste` over HTTP. Their logic: the typing model, the rows and
the ratios, the command line; the HTTP one against the runtime's fake behind the
real API. Nothing here asserts a timing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from warmstart.runtime.bench import _bench_peers as bench_peers
from warmstart.runtime.bench import _paste, _paste_peers
from warmstart.runtime.bench._peers import Reply

from tests.bench.conftest import fake_system


def test_the_live_hit_asks_a_question_as_long_as_the_drafted_one() -> None:
    """The live hit computes the new words after Enter as the drafted case does: a
    question of the same length, another text from its first word on."""
    assert len(_paste.OTHER_QUESTION) == len(_paste.QUESTION)
    assert _paste.OTHER_QUESTION.split()[0] != _paste.QUESTION.split()[0]
    # a person's speed: 4 to 5 characters a second
    assert 4 <= len(_paste.QUESTION) / _paste.TYPE_SECONDS <= 5


def test_typing_sends_the_paste_at_once_then_the_question_as_it_grows() -> None:
    sent: list[tuple[float, str]] = []
    t0 = time.perf_counter()

    def send(typed: str) -> dict[str, Any]:
        sent.append((time.perf_counter() - t0, typed))
        ready = len(sent) == 2  # the second draft finished what was certain
        return {"state": "ready" if ready else "superseded", "ready": 5, "certain": 5}

    typing = _paste.type_question(send, type_s=0.3)
    typing.join()
    assert sent[0] == (pytest.approx(0, abs=0.2), "")  # the paste alone, at once
    typed = [t for _, t in sorted(sent)]
    assert typed == [_paste.QUESTION[:n] for n in range(0, len(_paste.QUESTION), 12)]
    assert typing.enter_s >= 0.3 + _paste.LAST_PAUSE_S - 0.05
    told = typing.as_dict()
    assert told["paste_ready_before_enter"] and told["paste_ready_s"] < typing.enter_s
    assert "before Enter" in _paste.typing_line(told)
    late = {**told, "paste_ready_before_enter": False, "paste_ready_s": None}
    assert "NOT finished" in _paste.typing_line(late)


def _row(ttft: float, cached: int, prefilled: int) -> dict[str, Any]:
    return {"ttft_s": ttft, "cached_tokens": cached, "prefilled_tokens": prefilled}


def test_the_in_process_rows_say_what_each_is_and_the_ratio_is_against_the_live_hit() -> None:
    rows = {
        "cold": _row(20.0, 0, 3000),
        "live": _row(0.5, 2980, 25),
        "repeat": _row(0.005, 3005, 0),
        "drafted": {**_row(1.0, 2980, 26), "prompt_tokens": 3006},
    }
    typing = _paste.Typing(enter_s=16.4, drafts=[{"state": "ready", "after_s": 12.0}])
    result = _paste.paste_result(rows, typing, 16.0)
    assert result["drafted_vs_live"] == 2.0 and result["cold_vs_drafted"] == 20.0
    text = _paste.render_paste(result)
    assert "live hit: the paste live, another question of the same length" in text
    assert "exact repeat" in text and "computes nothing" in text
    assert "with drafts / live hit         2.00x" in text
    assert "ready 12.0 s after it was pasted, before Enter at 16.4 s" in text


def _reply(ttft: float, cached: int | None = 0) -> Reply:
    return Reply(ttft, 30.0, 16, 3006, cached, "x")


def test_the_peers_table_puts_warmstart_beside_llama_server() -> None:
    replies = {
        "llama-server": {"cold": _reply(20.0), "live": _reply(0.4, 2980), "repeat": _reply(0.05)},
        "warmstart": {"cold": _reply(21.0), "live": _reply(0.5, 2980), "repeat": _reply(0.1)},
    }
    replies["llama-server"]["enter"] = _reply(20.0)
    replies["warmstart"]["enter"] = _reply(1.0, 2980)
    run = _paste_peers.PasteRun(100, 16.0)
    text = _paste_peers.render_paste_peers(replies, run)
    enter = "| after Enter: another paste, typed with drafts (llama-server: none) |"
    assert f"{enter} 20.000 s (0) | 1.000 s (2,980) | 0.05 |" in text
    assert "warmstart with drafts / its live hit (issue 40: at most 3): 2.00" in text
    assert "warmstart without drafts / with drafts (issue 40: at least 20): 21.00" in text
    assert "llama-server after Enter / warmstart with drafts: 20.00" in text
    assert "warmstart with drafts / llama-server's live hit: 2.50" in text


def test_paste_runs_llama_server_and_warmstart_only(capsys: pytest.CaptureFixture[str]) -> None:
    args = bench_peers.parse_args(["--paste", "--paste-tokens", "300"])
    assert args.systems == ["llama-server", "warmstart"] and args.paste_tokens == 300
    assert args.type_seconds == _paste.TYPE_SECONDS
    with pytest.raises(SystemExit):
        bench_peers.parse_args(["--paste", "--systems", "hearth"])
    assert "--paste runs llama-server and warmstart only" in capsys.readouterr().err


def test_the_paste_scenario_runs_side_by_side_over_http(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the runtime's fake behind the real API (twice, one named as each
    system): warmstart's side sends drafts to the real route, llama-server's none."""
    monkeypatch.setattr(_paste_peers, "QUIET_S", 0.0)
    homes = [tmp_path / "llama-server", tmp_path / "warmstart"]
    for home in homes:
        home.mkdir()
    run = _paste_peers.PasteRun(200, 0.5)
    replies = _paste_peers.run_paste_peers(
        [fake_system("llama-server"), fake_system("warmstart")], homes, run
    )
    for system in ("llama-server", "warmstart"):
        assert set(replies[system]) == {"cold", "live", "repeat", "enter"}
        assert all(r.text and r.prompt_tokens > 0 for r in replies[system].values())
    assert run.typing is not None and run.typing.drafts  # warmstart's, over HTTP
    assert all(d["state"] for d in run.typing.drafts)
    assert "warmstart: the drafts" in _paste_peers.render_paste_peers(replies, run)


def test_the_in_process_scenario_runs_on_the_fake_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`warmstart bench --paste`'s steps, on the runtime over the fake engine: the
    live hit finds the paste cached and computes the new question; with drafts,
    Enter finds what the drafts computed."""
    import warmstart.runtime.serving as serving

    from tests.conftest import fake_runtime

    rt = fake_runtime(tmp_path)
    monkeypatch.setattr(serving, "open_runtime", lambda settings, prewarm: rt)
    result = _paste.run_paste(rt.settings, 200, type_s=0.3)
    live, repeat, drafted = result["live"], result["repeat"], result["drafted"]
    assert 0 < live["cached_tokens"] < live["prompt_tokens"] and live["prefilled_tokens"] > 0
    assert repeat["prefilled_tokens"] <= live["prefilled_tokens"]
    assert drafted["cached_tokens"] > 0 and result["typing"]["drafts"]
    assert "live hit: the paste live" in _paste.render_paste(result)
