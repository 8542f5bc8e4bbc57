"""LocalRuntime over the fake engine: the Runtime contract without a model (the real
queue, sessions, store, stats and rules; deterministic text)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from warmstart.runtime.engine._fake import FakeOptions
from warmstart.runtime.errors import Busy, ContextOverflow, RequestError
from warmstart.runtime.serving._core import LocalRuntime
from warmstart.runtime.serving._service import Runtime
from warmstart.runtime.serving._streams import QueueStream
from warmstart.runtime.types import Done, Message, Report, Request, Sampling, Stream, Token

from tests.conftest import fake_runtime


def _text(stream: Stream) -> tuple[str, Report]:
    assert isinstance(stream, QueueStream)
    return stream.text()


def _chat(text: str, **sampling: object) -> Request:
    return Request(messages=(Message("user", text),), sampling=Sampling(**sampling))  # type: ignore[arg-type]


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[LocalRuntime]:
    runtime = fake_runtime(tmp_path, FakeOptions(prefill_delay=0.0))
    yield runtime
    runtime.close()


def test_is_a_runtime(fake: LocalRuntime) -> None:
    assert isinstance(fake, Runtime)


def test_greedy_reply_is_a_function_of_the_last_user_message(fake: LocalRuntime) -> None:
    a, _ = _text(fake.generate(_chat("hello")))
    b, _ = _text(fake.generate(_chat("hello")))
    c, _ = _text(fake.generate(_chat("goodbye")))
    assert a == b != c


def test_seeded_sampling_is_reproducible(fake: LocalRuntime) -> None:
    runs = {_text(fake.generate(_chat("x", temperature=1.0, seed=3)))[0] for _ in range(3)}
    assert len(runs) == 1
    others = {_text(fake.generate(_chat("x", temperature=1.0, seed=s)))[0] for s in range(6)}
    assert len(others) > 1


def test_stream_yields_tokens_then_one_done(fake: LocalRuntime) -> None:
    events = list(fake.generate(_chat("hi")))
    assert all(isinstance(e, Token) for e in events[:-1]) and isinstance(events[-1], Done)
    report = events[-1].report
    assert report.completion_tokens == len(events) - 1
    assert report.prompt_tokens == fake.count_tokens(_chat("hi"))


def test_max_tokens_and_stop(fake: LocalRuntime) -> None:
    _, report = _text(fake.generate(_chat("long", max_tokens=2)))
    assert (report.completion_tokens, report.finish_reason) == (2, "length")
    full, _ = _text(fake.generate(_chat("long")))
    stop = full.split()[1]
    cut, report = _text(fake.generate(_chat("long", stop=(stop,))))
    assert stop not in cut and report.finish_reason == "stop"


def test_repeat_restores_from_live(fake: LocalRuntime) -> None:
    _, first = _text(fake.generate(_chat("same question")))
    _, second = _text(fake.generate(_chat("same question")))
    assert first.cached_tokens == 0
    assert second.restored["live"] == second.prompt_tokens


def test_validation_errors(fake: LocalRuntime) -> None:
    with pytest.raises(RequestError):
        fake.generate(Request())
    with pytest.raises(RequestError):
        fake.generate(_chat("x", temperature=5.0))
    with pytest.raises(ContextOverflow):
        fake.generate(_chat("word " * 5000))


def test_busy_when_the_queue_is_full(tmp_path: Path) -> None:
    options = FakeOptions(token_delay=0.05)
    runtime = fake_runtime(tmp_path, options, max_queue=1, resident_sequences=1)
    try:
        first = runtime.generate(_chat("a"))
        streams = [first]
        with pytest.raises(Busy) as caught:
            for i in range(5):
                streams.append(runtime.generate(_chat(f"b{i}")))
        assert caught.value.retry_after >= 1
        for stream in streams:
            stream.cancel()
            _text(stream)
    finally:
        runtime.close()


def test_cancel_ends_with_cancelled(tmp_path: Path) -> None:
    slow = fake_runtime(tmp_path, FakeOptions(token_delay=0.05))
    try:
        stream = slow.generate(_chat("cancel me"))
        iterator = iter(stream)
        assert isinstance(next(iterator), Token)
        threading.Timer(0.01, stream.cancel).start()
        done = [e for e in iterator if isinstance(e, Done)]
        assert done[0].report.finish_reason == "cancelled"
    finally:
        slow.close()


def test_tiers_demote_and_prewarm_promotes(tmp_path: Path) -> None:
    """One live sequence and a RAM pool of six chunks: older conversations leave the
    context, then RAM, for the disk; prewarm brings one back to RAM, and its next
    request restores from there."""
    options = FakeOptions(prefill_delay=0.0)
    runtime = fake_runtime(tmp_path, options, resident_sequences=1, ram_pool_bytes=24 << 10)
    try:
        for name in ("a", "b", "c", "d"):
            _text(runtime.generate(Request(messages=(Message("user", name),), session_id=name)))
            assert runtime.wait_idle(30)
        tiers = {s.id: s.tiers for s in runtime.sessions()}
        assert tiers["d"]["live"] > tiers["c"]["live"]  # the others share only "<|user|> :"
        assert tiers["a"]["ram"] == 0 and tiers["a"]["disk"] > 0
        assert runtime.stats()["evictions"] >= 3  # each one pushed the last out of the context
        assert runtime.prewarm("a") > 0
        assert runtime.session("a").tiers["ram"] > 0  # type: ignore[union-attr]
        assert runtime.prewarm("missing") == 0
        _, report = _text(runtime.generate(_chat_in("a")))
        assert report.restored["ram"] > 0
    finally:
        runtime.close()


def _chat_in(session: str) -> Request:
    return Request(messages=(Message("user", session),), session_id=session)


def test_sessions_and_delete(fake: LocalRuntime) -> None:
    _text(fake.generate(Request(messages=(Message("user", "q"),), session_id="s1")))
    [info] = fake.sessions()
    assert info.id == "s1" and info.n_tokens > 0 and info.messages[-1].role == "assistant"
    assert fake.delete_session("s1") and not fake.delete_session("s1")
    assert fake.session("s1") is None


def test_stats_and_settings_report(fake: LocalRuntime) -> None:
    _text(fake.generate(_chat("q")))
    stats = fake.stats()
    assert stats["requests"] == 1 and set(stats["tiers"]) == {"live", "ram", "disk"}
    report = fake.settings_report()
    assert all({"value", "reason"} <= set(v) for v in report.values())


def test_close_is_idempotent_and_ends_pending_streams(tmp_path: Path) -> None:
    runtime = fake_runtime(tmp_path, FakeOptions(token_delay=0.05), resident_sequences=1)
    stream = runtime.generate(_chat("pending"))
    runtime.close()
    runtime.close()
    _, report = _text(stream)
    # the worker drains on close: the reply in progress ends as it would have
    assert report.finish_reason == "stop" and report.completion_tokens > 0


def test_a_session_deleted_while_its_chunks_are_kept_stays_deleted(tmp_path: Path) -> None:
    """Settling the reply and the capture run after its Done (slow here: 20 ms a
    token); a delete in between is not undone when they save the chunks' key."""
    runtime = fake_runtime(tmp_path, FakeOptions(prefill_delay=0.02))
    try:
        _text(runtime.generate(Request(messages=(Message("user", "q"),), session_id="gone")))
        assert runtime.delete_session("gone")
        assert runtime.wait_idle(60)
        assert runtime.session("gone") is None and not runtime.delete_session("gone")
    finally:
        runtime.close()


def test_the_stores_writes_wait_while_a_client_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a request is prefilled or decoded the disk writes hold (they would take a
    core from the engine's threads); once its client has the answer they go. Looked at
    in each decode step, not by the reader: on a loaded machine the reader may come for
    the reply's last pieces after the worker is done with it."""
    runtime = fake_runtime(tmp_path, FakeOptions(prefill_delay=0.01))
    try:
        assert runtime.store is not None
        store, step = runtime.store, runtime.engine.step
        seen: list[bool] = []

        def looked_at(res, token):  # type: ignore[no-untyped-def]
            seen.append(store.quiet)
            step(res, token)

        monkeypatch.setattr(runtime.engine, "step", looked_at)
        _text(runtime.generate(Request(messages=(Message("user", "a question"),))))
        assert seen and not any(seen)
        assert runtime.wait_idle(60) and store.quiet
    finally:
        runtime.close()


def test_no_capture_or_disk_write_runs_between_two_steps_of_a_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU a reply's decode threads take every core, so nothing of warmstart's own
    work runs while a reply is decoded (issue 45): a turn sent the moment the last one
    ended finds that one's capture done first, and the disk writes wait for the reply's
    end. Counted, not timed: captures, writes and decode steps go into one log in the
    order they happen, and no capture or write comes between two steps of one reply."""
    from warmstart.runtime.kvstore._transfer import Transfers

    options = FakeOptions(prefill_delay=0.001, token_delay=0.005, reply_words=30)
    runtime = fake_runtime(tmp_path, options)
    log: list[str] = []
    step, snapshot, write = runtime.engine.step, runtime.engine.snapshot, Transfers.write

    def logged_step(res, token):  # type: ignore[no-untyped-def]
        log.append("step")
        step(res, token)

    def logged_snapshot(*args):  # type: ignore[no-untyped-def]
        log.append("capture")
        return snapshot(*args)

    def logged_write(job):  # type: ignore[no-untyped-def]
        log.append("write")
        time.sleep(0.02)  # a chunk's compression and write: still going when turn 2 comes
        return write(job)

    monkeypatch.setattr(runtime.engine, "step", logged_step)
    monkeypatch.setattr(runtime.engine, "snapshot", logged_snapshot)
    monkeypatch.setattr(Transfers, "write", staticmethod(logged_write))
    try:
        first = (Message("user", " ".join(f"w{i}" for i in range(60))),)
        log.append("request")
        reply, _ = _text(runtime.generate(Request(messages=first, session_id="s")))
        turn = (*first, Message("assistant", reply), Message("user", "and then"))
        log.append("request")  # at once: the first turn's capture and writes are due now
        _, report = _text(runtime.generate(Request(messages=turn, session_id="s")))
        assert runtime.wait_idle(60) and runtime.store is not None and runtime.store.flush(60)
    finally:
        runtime.close()
    assert report.completion_tokens >= 20 and "capture" in log and "write" in log
    starts = [i for i, kind in enumerate(log) if kind == "request"] + [len(log)]
    for begin, end in itertools.pairwise(starts):  # each reply's steps, and what between
        steps = [i for i in range(begin, end) if log[i] == "step"]
        assert len(steps) >= 20 and set(log[steps[0] : steps[-1]]) == {"step"}


def test_a_stream_says_when_its_reader_has_handled_what_was_put() -> None:
    stream = QueueStream()
    assert not stream.wait_handled(0)  # nobody has looked yet
    stream.put_token("a")
    assert not stream.wait_handled(0.01)
    assert isinstance(stream.poll(), Token)  # taken, not yet handled (being written)
    assert not stream.wait_handled(0)
    assert stream.poll() is None  # back for the next one: all of it is handled
    assert stream.wait_handled(0)
    stream.put_token("b")
    assert not stream.wait_handled(0)


def test_the_first_token_is_handed_over_before_the_second_is_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server writes a reply's first token to its socket before the next decode
    takes the cores (the wait is bounded; here long enough never to run out)."""
    from warmstart.runtime.serving import _pipeline

    monkeypatch.setattr(_pipeline, "HANDOFF_S", 30.0)
    runtime = fake_runtime(tmp_path, FakeOptions(prefill_delay=0.0))
    written: list[str] = []
    steps: list[int] = []
    engine_step = runtime.engine.step

    def step(res, token):  # type: ignore[no-untyped-def]
        steps.append(len(written))
        engine_step(res, token)

    monkeypatch.setattr(runtime.engine, "step", step)
    try:
        stream = runtime.generate(_chat("hello", max_tokens=4))
        assert isinstance(stream, QueueStream)
        ready = threading.Event()
        stream.watch(ready.set)
        while True:  # the event loop's way: woken, then poll until nothing is left
            ready.wait(30)
            ready.clear()
            event = stream.poll()
            while event is not None:
                if isinstance(event, Token):
                    written.append(event.text)
                if isinstance(event, Done):
                    break
                event = stream.poll()
            if isinstance(event, Done):
                break
    finally:
        runtime.close()
    assert steps and steps[0] >= 1  # the first decode after the first token came after it


@pytest.mark.parametrize(("tile", "decodes"), [(8, 1), (0, 2)], ids=["tiled", "no-tile"])
def test_another_short_question_on_a_live_sequence_is_one_decode(
    tmp_path: Path, tile: int, decodes: int
) -> None:
    """Counted, not timed: after the same system prompt, another short question
    continues the live sequence, and where a batch tile is known its text and the
    assistant's opening are one batch, one decode (its tail rides in the question's
    batch: kvstore/_batches.py, ``_ride``); without one, two decodes, as before."""
    rt = fake_runtime(tmp_path, FakeOptions(prefill_delay=0.0), batch_tile=tile)
    # a system prompt longer than a question and its reply: the sequence is shared
    handbook = "Opening hours are nine to five on weekdays; the office closes on holidays. "
    system = Message("system", "You answer questions about the staff handbook. " + handbook * 3)
    first = Request(messages=(system, Message("user", "When does the office open?")))
    _text(rt.generate(first))
    rt.wait_idle()
    calls: list[tuple[int, bool]] = []  # (tokens, wants logits) of every prefill decode
    prefill = rt.engine.prefill

    def counted(res, tokens, want_logits, ends=None):  # type: ignore[no-untyped-def]
        calls.append((len(tokens), want_logits))
        return prefill(res, tokens, want_logits, ends)

    rt.engine.prefill = counted  # type: ignore[method-assign]
    other = Request(messages=(system, Message("user", "Where do holiday requests go?")))
    _, report = _text(rt.generate(other))
    rt.close()
    prompt = calls[: 1 + next(i for i, (_, last) in enumerate(calls) if last)]
    assert report.restored["live"] > 0 and report.restored["ram"] == 0, report
    assert len(prompt) == decodes, prompt
    assert sum(n for n, _ in prompt) == report.prompt_tokens - report.restored["live"]
