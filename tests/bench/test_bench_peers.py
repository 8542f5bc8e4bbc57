"""bench_peers without llama-server: the pure parts (prompts, percentiles, tables, the
command line), then the whole benchmark, --quick, against warmstart alone on the real
model. It prints figures; nothing here asserts a timing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from warmstart.runtime.bench import _bench_peers as bench_peers
from warmstart.runtime.bench import _peers as _peers
from warmstart.runtime.bench import _servers, _systems, _trace
from warmstart.runtime.bench._peers import Reply
from warmstart.runtime.bench._systems import Setup
from warmstart.runtime.bench._trace import Batching, TracePlan, TraceResult

from tests.bench.conftest import fake_system


def _result(
    ttfts: list[float],
    tps: float,
    tokens: int,
    wall_s: float,
    batching: Batching | None = None,
    pauses: list[float] | None = None,
) -> TraceResult:
    """A trace of len(ttfts) requests, each reply ``tokens`` tokens decoded at ``tps``."""
    pauses = pauses or [math.nan] * len(ttfts)
    requests = [
        _trace.Request(0, 0, 0, 0.0, ttft, tps, pause, tokens, 100, None)
        for ttft, pause in zip(ttfts, pauses, strict=True)
    ]
    return TraceResult(requests, wall_s, batching=batching)


def test_the_prompts_are_the_same_in_every_run_and_differ_between_chats() -> None:
    assert _peers.document(7, 2_000) == _peers.document(7, 2_000)
    assert _peers.document(7, 2_000) != _peers.document(8, 2_000)
    assert 2_000 <= len(_peers.document(7, 2_000)) < 2_200
    quick, full = _peers.Prompts.make(True), _peers.Prompts.make(False)
    assert quick.a != quick.b and len(full.a) > 4 * len(quick.a)


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 37)]  # 36 requests, as in the trace
    assert _trace.percentile(values, 50) == 18.0
    assert _trace.percentile(values, 99) == 36.0
    assert _trace.percentile([3.0], 99) == 3.0
    assert math.isnan(_trace.percentile([], 50))


def test_decode_is_timed_over_the_tokens_whose_text_came() -> None:
    """llama-server counts the end-of-turn token, which shows no text and is decoded
    after the last piece: the same stream times the same whatever the server counts."""
    started = 0.0
    pieces = ["w"] * 25  # 25 pieces, 1.0 s from the first to the last
    counted = _peers._reply(started, 0.5, 1.5, {"completion_tokens": 26}, pieces)
    uncounted = _peers._reply(started, 0.5, 1.5, {"completion_tokens": 25}, pieces)
    assert counted.decode_tps == uncounted.decode_tps == 24.0
    assert counted.completion_tokens == 26 and counted.text == "w" * 25
    # a piece that holds two tokens: timed as one (never more tokens than were sent)
    assert (
        _peers._reply(started, 0.5, 1.5, {"completion_tokens": 25}, pieces[:21]).decode_tps == 20.0
    )
    assert math.isnan(_peers._reply(started, 0.5, 0.5, {"completion_tokens": 1}, ["w"]).decode_tps)


def test_a_reply_of_one_piece_has_no_pause() -> None:
    usage = {"completion_tokens": 2}
    assert _peers._reply(0.0, 0.5, 0.9, usage, ["a", "b"], 0.4).longest_pause == 0.4
    assert math.isnan(_peers._reply(0.0, 0.5, 0.5, usage, ["ab"], 0.0).longest_pause)


def _reply(ttft: float, tps: float = 30.0, n: int = 16) -> Reply:
    return Reply(ttft, tps, n, 100, 0, "x")


def test_the_scenario_table_has_every_case_and_the_ratio() -> None:
    labels = _peers.FIRST_LABELS + _peers.RESTART_LABELS
    results = {
        "llama-server": {x: _reply(1.0) for x in labels},
        "warmstart": {x: _reply(0.5, tps=15.0) for x in labels},
        "warmstart-fresh": {x: _reply(0.5) for x in _peers.FIRST_LABELS},
    }
    table = _peers.scenario_table(
        results, ["llama-server", "hearth", "warmstart", "warmstart-fresh"]
    )
    lines = table.splitlines()
    assert lines[0].split("|")[1:-1] == [
        " case (TTFT, client side) ",
        " llama-server ",
        " warmstart ",
        " warmstart-fresh ",
        " warmstart / llama-server ",
    ]  # hearth was left out, so it has no column
    # every row but turn 3, the long document's case, which none of them ran
    assert len(lines) == 2 + len(_peers.SCENARIO_ROWS) - 1 + len(_peers.DECODE_ROWS)
    assert not any("turn 3" in x for x in lines)
    cold = lines[2].split("|")
    assert cold[2].strip() == "1.000 s" and cold[-2].strip() == "0.50"
    restart = next(x for x in lines if x.startswith("| after a restart: turn 2"))
    assert restart.split("|")[4].strip() == "-"  # the fresh column has no restart
    decode = next(x for x in lines if "the session's replies (first process)" in x)
    assert decode.split("|")[-2].strip() == "0.50"
    # a case sent several times shows the median of its replies
    for label, ttft in zip(_peers.OTHER_Q, (0.2, 0.9, 0.3, 0.25, 0.8), strict=True):
        results["warmstart"][label] = _reply(ttft)
    table = _peers.scenario_table(results, ["llama-server", "warmstart"])
    other = next(x for x in table.splitlines() if "another question (median of 5)" in x)
    assert other.split("|")[3].strip() == "0.300 s" and other.split("|")[-2].strip() == "0.30"
    # cold is the mean of both chats' cold prompts
    results["warmstart"]["B cold"] = _reply(1.5)
    table = _peers.scenario_table(results, ["llama-server", "warmstart"])
    cold = table.splitlines()[2].split("|")
    assert cold[3].strip() == "1.000 s" and cold[-2].strip() == "1.00"


def test_the_trace_table_shows_the_tail_of_each_system() -> None:
    plan = TracePlan.make(False)
    assert plan.requests == 36 and plan.clients * plan.chats > 4  # more than fit live
    # one reply stood still for 3 s
    fast = _result([0.1] * 35 + [2.0], 30.0, 16, 12.0, pauses=[0.02] * 35 + [3.0])
    table = _trace.trace_table({"llama-server": fast, "warmstart": fast}, plan)
    p99 = next(x for x in table.splitlines() if x.startswith("| P99 TTFT"))
    assert p99.split("|")[2].strip() == "2.000 s"
    pause = next(x for x in table.splitlines() if x.startswith("| P99 of a reply's longest"))
    assert pause.split("|")[2].strip() == "3.000 s"
    assert "36 requests" in table


def test_the_trace_takes_n_clients_in_the_same_total_context(tmp_path: Path) -> None:
    """--clients N: N clients, llama-server -np N, warmstart N resident sequences, each
    a share of the same total context."""
    from warmstart.runtime.bench._systems import TOTAL_CTX, trace_server

    plan = TracePlan.make(False, clients=8)
    assert plan.clients == 8 and plan.requests == 72
    setup = Setup(tmp_path / "m.gguf", 2, [], tmp_path / "llama-server", None)
    llama = trace_server(setup, "llama-server", 8).argv(1234, tmp_path)
    assert llama[llama.index("-np") + 1] == "8" and llama[llama.index("-c") + 1] == str(TOTAL_CTX)
    ours = trace_server(setup, "warmstart", 8).argv(1234, tmp_path)
    assert ours[ours.index("--resident-sequences") + 1] == "8"
    assert ours[ours.index("--n-ctx") + 1] == str(TOTAL_CTX // 8)
    assert bench_peers.parse_args(["--clients", "8"]).clients == 8
    assert bench_peers.parse_args([]).clients == 4


def test_a_trace_only_report_names_the_trace_servers_settings(tmp_path: Path) -> None:
    plan = TracePlan.make(True, clients=8)
    setup = Setup(tmp_path / "m.gguf", 2, [], None, None)
    trace = {"warmstart": _result([0.1] * 32, 30.0, 8, 4.0)}
    text = bench_peers.render({}, trace, ["warmstart"], setup, plan)
    assert text.splitlines()[0] == "model m.gguf"  # no scenario: nothing of it named
    assert "llama-server -t 2 -np 8 -c 8192" in text and "--n-ctx 1024" in text


@pytest.mark.parametrize("clients", ["0", "64"])
def test_a_trace_of_no_clients_or_too_many_is_a_usage_error(
    clients: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        bench_peers.parse_args(["--clients", clients])
    assert "--clients" in capsys.readouterr().err


def test_the_trace_table_shows_the_decode_steps_replies_shared() -> None:
    """warmstart's counters, pooled over the runs, with their share of the replies'
    tokens and the reason for decode_batch;
    llama-server has none."""
    plan = TracePlan.make(True, clients=2)  # 8 requests of 8 tokens
    one = Batching(10, 20, 8, "measured", step_ms={1: 10.0, 4: 30.0})
    two = Batching(12, 24, 8, "measured", step_ms={1: 20.0, 2: 15.0})
    ours = _result([0.1] * 8, 30.0, 8, 4.0, batching=one)
    ours.add(_result([0.1] * 8, 30.0, 8, 4.0, batching=two))
    pooled = TraceResult()
    pooled.add(ours)
    theirs = _result([0.1] * 16, 30.0, 8, 8.0)
    table = _trace.trace_table({"llama-server": theirs, "warmstart": pooled}, plan)
    row = next(x for x in table.splitlines() if x.startswith("| decode steps shared"))
    # 128 tokens of 16 replies, 44 of them decoded in shared steps
    assert row.split("|")[2:4] == [" - ", " 22 steps (44 tokens, 34% of the replies' tokens) "]
    assert "warmstart: decode_batch 8 (measured)" in table
    assert "llama-server: decode_batch" not in table
    # each run's mean step by its replies, the runs' means pooled
    assert "held, mean: 1: 15 ms, 2: 15 ms, 4: 30 ms" in table


def test_an_unknown_system_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench_peers.parse_args(["--systems", "warmstart,vllm"])
    assert exit_.value.code == 2 and "vllm" in capsys.readouterr().err


def test_a_missing_llama_server_with_skip_build_says_so(
    tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = bench_peers.main(
        [
            "--systems",
            "llama-server",
            "--skip-build",
            "--cache",
            str(tmp_path),
            "--model",
            str(model_path),
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "no llama-server at" in err and str(tmp_path) in err


def test_the_scenario_and_the_trace_run_against_a_served_api(tmp_path: Path) -> None:
    fake = fake_system("fake")
    prompts, plan = _peers.Prompts.make(True), TracePlan.make(True)
    replies: dict[str, Reply] = {}
    with _servers.running(fake, tmp_path, "first", _servers.server_env(fake, tmp_path)) as url:
        _peers.run_steps(url, _peers.first_process_steps(prompts), prompts.max_tokens, replies)
        _peers.run_steps(url, _peers.restart_steps(prompts), prompts.max_tokens, replies)
        trace = _trace.run_trace(url, plan)
    assert set(replies) == set(_peers.FIRST_LABELS + _peers.RESTART_LABELS)
    assert all(r.text and r.completion_tokens > 0 for r in replies.values())
    assert replies["A turn 2"].prompt_tokens > replies["A cold"].prompt_tokens
    assert len(trace.ttfts) == plan.requests and not trace.errors
    # every reply of several pieces has its longest pause between two of them
    assert len(trace.pauses) == plan.requests and all(0 <= x < 60 for x in trace.pauses)
    table = _peers.scenario_table({"fake": replies}, ["fake"])
    assert all(f"| {name} |" in table for name, _ in _peers.SCENARIO_ROWS if "turn 3" not in name)
    assert "| P99 TTFT |" in _trace.trace_table({"fake": trace}, plan)
    # the fake runtime decodes one reply at a time: no shared step, and says why
    assert trace.batching is not None and trace.batching.steps == 0
    assert trace.batching.most == 1 and trace.batching.reason


def test_the_decode_rounds_ratio_is_the_median_of_each_rounds_ratio() -> None:
    """Each round's two replies are seconds apart, at the same speed of the machine,
    which moves from one round to the next: the row's ratio is the median of the
    rounds' own ratios; a reply too short to time leaves its round out."""
    labels = _peers.FIRST_LABELS + _peers.RESTART_LABELS
    results = {s: {x: _reply(1.0, tps=60.0) for x in labels} for s in ("llama-server", "warmstart")}
    speeds = (40, 80, 50, 70, 60, 40, 80, 45, 75, 65)  # the machine's, round by round
    ratios = (0.90, 1.10, 1.02, 1.02, 1.02, 0.50, 1.02, 1.02, 1.30, 0.95)
    for label, speed, r in zip(_peers.DECODE_ROUNDS, speeds, ratios, strict=True):
        results["llama-server"][label] = _reply(1.0, tps=speed)
        results["warmstart"][label] = _reply(1.0, tps=speed * r, n=4 if r == 0.5 else 16)
    table = _peers.scenario_table(results, ["llama-server", "warmstart"]).splitlines()
    rounds = next(x for x in table if "alternating live repeats (first process" in x)
    assert rounds.split("|")[-2].strip() == "1.02"
    assert "| 1.00 |" in next(x for x in table if "alternating live repeats (after restart" in x)
    # the session's own replies are timed as before, without the rounds
    assert not set(_peers.DECODE_ROUNDS) & set(_peers.SESSION_LABELS)


def test_turn_2_goes_out_right_after_the_step_before_it() -> None:
    labels = [
        [label for label, _ in b]
        for b in _peers.blocks(_peers.first_process_steps(_peers.Prompts("", "", 0)))
    ]
    pairs = [["A after B", "A turn 2"], ["A again 2", "A turn 2 #2"], ["A again 3", "A turn 2 #3"]]
    assert all(pair in labels for pair in pairs)
    assert all(len(b) == 1 for b in labels if b not in pairs)


def test_the_long_document_sends_three_turns_at_once() -> None:
    """The long-document variant: ~6,000-token system prompts, and turn 3 goes out the
    moment turn 2's reply ends, with both turns before it in its history."""
    long, short = _peers.Prompts.make(False, long=True), _peers.Prompts.make(False)
    assert long.turns == 3 and len(long.a) > 3 * len(short.a)
    steps = _peers.first_process_steps(long)
    labels = [[label for label, _ in b] for b in _peers.blocks(steps)]
    assert ["A after B", "A turn 2", "A turn 3"] in labels
    replies = {"A cold": _reply(1.0), "A turn 2": Reply(1.0, 30.0, 16, 100, 0, "two")}
    third = dict(steps)["A turn 3"](replies)
    assert [m["content"] for m in third[1:-1]] == [
        _peers.QUESTIONS[0],
        "x",
        _peers.FOLLOW_UPS[0],
        "two",
    ]
    assert "A turn 3" not in _peers.FIRST_LABELS  # the usual scenario has two turns


def test_the_long_document_fits_warmstarts_context() -> None:
    """Each conversation gets llama-server's one slot of context, unless told."""
    args = bench_peers.parse_args(["--long", "--warmstart-args", "--n-threads 1"])
    assert bench_peers.warmstart_args(args) == ["--n-threads", "1", "--n-ctx", "8192"]
    args = bench_peers.parse_args(["--long", "--warmstart-args", "--n-ctx 16384"])
    assert bench_peers.warmstart_args(args) == ["--n-ctx", "16384"]
    assert bench_peers.warmstart_args(bench_peers.parse_args([])) == []


def test_prompts_are_sized_in_tokens_for_the_model() -> None:
    """A synthetic model's byte vocabulary takes far fewer characters a token."""
    ours = _peers.Prompts.make(False)
    synthetic = _peers.Prompts.make(False, chars_per_token=_peers.SYNTHETIC_CHARS_PER_TOKEN)
    assert 7_000 < len(ours.a) < 7_800 and 1_200 < len(synthetic.a) < 1_450
    assert len(_peers.Prompts.make(False, 600).a) < len(ours.a) / 2


def test_each_turn_2_follows_the_first_reply_with_a_follow_up_of_its_own() -> None:
    prompts = _peers.Prompts("system", "other", 16)
    steps = dict(_peers.first_process_steps(prompts))
    replies = {"A cold": _reply(1.0)}
    turns = [steps[label](replies) for label in _peers.TURN_2]
    assert all(t[:-1] == turns[0][:-1] for t in turns)  # the same history
    assert len({t[-1]["content"] for t in turns}) == len(turns)  # each asks anew


def test_the_trace_runs_interleaved_and_pools_every_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run one after the other, this machine's drift went into the trace's ratio."""
    order: list[str] = []

    def run_trace(server: _servers.Server, home: Path, plan: TracePlan) -> TraceResult:
        order.append(server.name)
        return _result([0.1] * plan.requests, 20.0, 16, 10.0)

    def server(setup: object, name: str, clients: int) -> _servers.Server:
        return _servers.Server(name, lambda port, home: [])

    monkeypatch.setattr(bench_peers, "run_trace", run_trace)
    monkeypatch.setattr(bench_peers, "trace_server", server)
    plan, names = TracePlan.make(True), ["llama-server", "warmstart"]
    setup = Setup(tmp_path, 2, [], None, None)
    pooled = bench_peers.run_traces(setup, names, plan, 3, str(tmp_path))
    assert order == [*names, *names[::-1], *names]
    assert len(pooled["warmstart"].ttfts) == 3 * plan.requests
    assert pooled["warmstart"].wall_s == 30.0
    assert "run 3 times on each system, interleaved" in _trace.trace_table(pooled, plan)


def test_the_scenario_runs_on_every_system_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_peers, "QUIET_S", 0.0)
    # a second at least between two steps (58 here) for cores the fakes never keep busy
    # (tests/bench/test_wait_quiet.py tests the wait)
    monkeypatch.setattr(bench_peers, "wait_quiet", lambda servers: 0.0)
    homes = [tmp_path / "one", tmp_path / "warmstart-fresh"]
    for home in homes:
        home.mkdir()
    prompts = _peers.Prompts.make(True)
    systems = [fake_system("one"), fake_system("warmstart-fresh")]
    scen = bench_peers.run_scenarios(systems, homes, prompts)
    assert set(scen["one"]) == set(_peers.FIRST_LABELS + _peers.RESTART_LABELS)
    assert set(scen["warmstart-fresh"]) == set(_peers.FIRST_LABELS)  # the first process only


def test_warmstart_serves_its_own_copy_of_a_model_file_that_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two servers mapping one file share its page cache, which neither does alone: the
    bench gives warmstart a copy of its own, once per home, unless the file is big for
    the host's RAM."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(1000))
    home = tmp_path / "home"
    copy = _systems.own_copy(model, home)
    assert copy != model and copy.is_relative_to(home) and copy.read_bytes() == model.read_bytes()
    stamp = copy.stat().st_mtime_ns
    assert _systems.own_copy(model, home) == copy and copy.stat().st_mtime_ns == stamp
    server = _systems.scenario_server(Setup(model, 2, [], None, None), "warmstart")
    assert str(copy) in server.argv(8080, home)
    monkeypatch.setattr(_systems, "OWN_COPY_RAM_SHARE", 1e-12)  # an 8B file on this host
    assert _systems.own_copy(model, tmp_path / "other") == model
    assert not (tmp_path / "other").exists()
    assert _systems.own_copy(tmp_path / "missing.gguf", home) == tmp_path / "missing.gguf"
