"""The soak run's bookkeeping on plain data (runtime/bench/_soak*.py): which replies
it samples, how it counts outcomes around the kill, what a restore must cover, and
that each criterion fails when it should. The run itself is `make bench-soak`."""

from __future__ import annotations

from pathlib import Path

from warmstart.runtime.bench import _soak
from warmstart.runtime.bench import _soak_report as rep
from warmstart.runtime.bench._soak_load import Chat, Exchange, reply_text

KILL = 100.0


def _ex(user: str, t: float, status: int | None = 200, **kw: object) -> Exchange:
    ex = Exchange(user, str(kw.pop("kind", "chat")), {}, str(kw.pop("phase", "first")), t)
    ex.ended, ex.status = t + 1, status
    for name, value in kw.items():
        setattr(ex, name, value)
    return ex


def _passing() -> rep.Report:
    r = rep.Report(settings={}, minutes=1, disk_budget_bytes=100, kill_mono=KILL)
    points = (("start", 80), ("middle (before the kill)", 100), ("end", 105))
    r.samples = [rep.ProcSample(label, 0, 1, mib << 20, 9) for label, mib in points]
    r.disk_peak_bytes, r.culled_chunks = 99, 3
    r.durable = [rep.Durable("alice", 9.0, 300, 256, 298, 200)]
    r.checked = [rep.Checked("bob", "chat", "restart", 40, 38, True, "hi", "hi")]
    r.exchanges = [_ex("alice", 1), _ex("bob", 2, phase="restart")]
    return r


def test_a_clean_run_passes_every_criterion() -> None:
    r = _passing()
    assert all(r.criteria().values()), r.criteria()
    assert "FAIL" not in rep.render(r)
    assert rep.to_json(r)["criteria"] == r.criteria()


def test_each_failure_fails_its_criterion() -> None:
    cases = {
        "zero 5xx": lambda r: r.exchanges.append(_ex("bob", 5, 500)),
        "no connection error but at the kill": lambda r: r.exchanges.append(
            _ex("bob", 150, None, phase="restart", error="ReadError: cut")
        ),
        "RSS at the end within 10% of the middle": lambda r: r.samples.__setitem__(
            -1, rep.ProcSample("end", 0, 1, 120 << 20, 9)
        ),
        "disk within its budget": lambda r: setattr(r, "disk_peak_bytes", 101),
        "disk filled to its budget (chunks evicted)": lambda r: setattr(r, "culled_chunks", 0),
        "every durable conversation restored": lambda r: r.durable.append(
            rep.Durable("bob", 30.0, 300, 256, 0, 200)
        ),
        "no error in the server logs": lambda r: r.log_errors.update(
            {"first.log": ["ERROR: a capture failed"]}
        ),
        "zero wrong replies in the sample": lambda r: r.checked.append(
            rep.Checked("bob", "chat", "first", 40, 38, False, "hi", "ho")
        ),
    }
    for name, spoil in cases.items():
        r = _passing()
        spoil(r)
        failed = [k for k, ok in r.criteria().items() if not ok]
        assert failed == [name], (name, failed)
        assert f"FAIL  {name}" in rep.render(r)


def test_connection_errors_cut_by_the_kill_are_counted_apart() -> None:
    r = _passing()
    r.exchanges += [
        _ex("alice", KILL - 5, None, error="RemoteProtocolError: gone"),  # cut by it
        _ex("alice", KILL - 30, None, error="ConnectError: refused"),  # long before
    ]
    r.exchanges[-2].ended = KILL + 1
    assert r.outcomes() == {
        "200": 2,
        "connection error (ConnectError)": 1,
        "connection error at the kill": 1,
    }


def test_the_sample_spreads_over_the_run_and_prefers_restored_replies() -> None:
    exchanges = [
        _ex(user, t, cached_tokens=t % 2, phase="first" if t < 50 else "restart",
            kind="durable" if 50 <= t < 60 else "chat")
        for t in range(100) for user in _soak.USERS
    ]  # fmt: skip
    sample = _soak.pick_sample(exchanges, 8)
    assert len(sample) == 16
    for user in _soak.USERS:
        mine = [e for e in sample if e.user == user]
        groups = [_soak._group(e) for e in mine]
        assert groups.count("first") == 3 and groups.count("durable") == 2
        assert groups.count("restart") == 3
        assert all(e.cached_tokens > 0 for e in mine)
    assert _soak.pick_sample([], 8) == []
    few = _soak.pick_sample(exchanges[:6], 8)  # fewer than asked for: each once
    assert len(few) == len({id(e) for e in few}) == 2  # the one restored reply of each


def test_a_chat_goes_on_from_its_last_reply_or_its_tool_results() -> None:
    chat = Chat("alice", [{"role": "user", "content": "q"}])
    call = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f"}}]}
    chat.history = [{"role": "user", "content": "q"}, call]
    chat.messages = [*chat.history, {"role": "tool", "tool_call_id": "c1", "content": "{}"}]
    assert chat.going_on() == chat.messages
    chat.messages.append({"role": "user", "content": "a question cut by the kill"})
    chat.history = [*chat.history[:1], {"role": "assistant", "content": "a"}]
    assert chat.going_on()[:-1] == chat.history and chat.going_on()[-1]["role"] == "user"


def test_tool_calls_compare_by_name_and_arguments_not_ids() -> None:
    one = {"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}]}
    two = {"tool_calls": [{"id": "b", "function": {"name": "f", "arguments": "{}"}}]}
    assert reply_text(one) == reply_text(two) != reply_text({"content": "{}"})


def test_the_logs_errors_are_picked_out(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text("INFO: up\nERROR: gone\nTraceback (most recent call last):\n")
    assert rep.log_errors(tmp_path / "a.log") == [
        "ERROR: gone",
        "Traceback (most recent call last):",
    ]
    assert rep.log_errors(tmp_path / "none.log") == []


def test_the_folder_counts_its_files(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b").write_bytes(bytes(10_000))
    assert 10_000 <= rep.folder_bytes(tmp_path) < 20_000


def test_a_chat_shorter_than_a_chunk_tells_nothing_about_durability() -> None:
    r = _passing()
    r.durable.append(rep.Durable("bob", 20.0, 40, 0, 0, 200))  # nothing to restore
    assert all(r.criteria().values())
    assert "1 of 1 conversations" in rep.render(r) and "1\nmore" not in rep.render(r)
    r.durable = r.durable[1:]
    assert not r.criteria()["every durable conversation restored"]
