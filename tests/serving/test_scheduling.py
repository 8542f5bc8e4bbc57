"""Which request the worker steps next: among clients that wait, short prompts first,
the fewest tokens left before the first token first (a cache hit is not held up by
another client's cold prefill), then the replies being decoded, then long prompts
first come first (a cold prefill does not stop the replies being streamed, for at most
HOLD_S); a reply gets a step at least every STALL_S, and work whose client has its
answer waits for all of them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from warmstart.runtime.engine._fake import FakeEngine, FakeOptions
from warmstart.runtime.serving import _schedule as rules
from warmstart.runtime.serving._schedule import EndNow, JobView, Phase, Turn
from warmstart.runtime.serving._worker import Worker
from warmstart.runtime.types import TIERS, Message, Request, Sampling

from tests.conftest import fake_runtime

NOW = 100.0


def test_short_prompts_go_first_then_replies_then_long_prompts() -> None:
    def first(*jobs: JobView) -> JobView:
        return min(jobs, key=lambda j: rules.rank(j, NOW))

    cold = JobView(Phase.PREFILLING, to_prefill=1800, stepped_at=NOW, arrived=NOW)
    hit = JobView(Phase.PREFILLING, to_prefill=15, stepped_at=NOW, arrived=NOW)
    fresh = JobView(Phase.WAITING, arrived=NOW)  # its first step finds out what is cached
    reply = JobView(Phase.DECODING, stepped_at=NOW, arrived=NOW)
    answered, capture = JobView(Phase.SETTLING), JobView(Phase.CAPTURING)
    draft = JobView(Phase.DRAFTING)
    ranked = sorted([cold, hit, fresh, reply, answered, capture], key=lambda j: rules.rank(j, NOW))
    assert ranked == [fresh, hit, reply, cold, capture, answered]
    assert rules.rank(draft, NOW) == rules.rank(answered, NOW)
    # a reply that waited long enough for its next token, a short prompt long enough
    # for its batch, a long prompt long enough since it came
    stalled = JobView(Phase.DECODING, stepped_at=NOW - rules.STALL_S)
    starved = JobView(Phase.PREFILLING, to_prefill=40, stepped_at=NOW - rules.STARVE_S)
    held = JobView(Phase.PREFILLING, to_prefill=1800, stepped_at=NOW, arrived=NOW - rules.HOLD_S)
    assert first(cold, hit, stalled) is stalled and first(hit, starved) is starved
    assert first(hit, reply, held) is hit and first(reply, held) is held
    assert first(held, starved) is starved and first(held, cold) is held
    # long prompts go in the order they came, not the shortest first
    older = JobView(Phase.PREFILLING, to_prefill=1800, stepped_at=NOW, arrived=NOW - 1)
    shorter = JobView(Phase.PREFILLING, to_prefill=500, stepped_at=NOW, arrived=NOW)
    assert first(shorter, older) is older
    # the line between short and long
    edge = JobView(Phase.PREFILLING, rules.SHORT_PROMPT_TOKENS, stepped_at=NOW, arrived=NOW)
    past = JobView(Phase.PREFILLING, rules.SHORT_PROMPT_TOKENS + 1, stepped_at=NOW, arrived=NOW)
    assert first(reply, edge) is edge and first(reply, past) is reply


def test_only_a_client_that_would_go_first_splits_a_prompts_decodes() -> None:
    """A prompt is prefilled in short decodes and pieces only while a client waits that
    would go first (a hit, a request not looked at yet, one still queued), or a reply is
    being decoded while the prompt is not overdue; beside other cold prompts it goes in
    whole merged batches (a burst of cold prompts then takes what each alone takes: in
    64-token pieces, 448 tokens took 9% longer), and so does an overdue one beside
    replies."""
    job = JobView(Phase.PREFILLING, to_prefill=440, stepped_at=0.0, arrived=NOW)
    cold = JobView(Phase.PREFILLING, to_prefill=450, stepped_at=0.0)
    hit = JobView(Phase.PREFILLING, to_prefill=15, stepped_at=0.0)
    fresh = JobView(Phase.WAITING)
    reply, answered = JobView(Phase.DECODING, stepped_at=0.0), JobView(Phase.CAPTURING)
    draft = JobView(Phase.DRAFTING)
    assert not rules.holds_up(job, [cold, answered, draft], queued=False, now=NOW)
    assert rules.holds_up(job, [cold, hit], queued=False, now=NOW)
    assert rules.holds_up(job, [reply, fresh], queued=False, now=NOW)
    assert rules.holds_up(job, [cold], queued=True, now=NOW)
    # replies being decoded: pieces until the prompt is overdue, then whole batches
    assert rules.holds_up(job, [cold, reply], queued=False, now=NOW)
    late = NOW + rules.HOLD_S + rules.FINISHING_GRACE_S
    assert rules.holds_up(job, [cold, reply], queued=False, now=late - 0.1)
    assert not rules.holds_up(job, [cold, reply], queued=False, now=late)
    assert rules.holds_up(job, [cold, reply, hit], queued=False, now=late)


def test_a_reply_about_to_end_ends_before_a_held_prompt() -> None:
    """A reply with at most FINISHING_TOKENS left of its max_tokens goes before a long
    prompt that has waited HOLD_S (a few steps end it, where it would stand still for
    the prompt's seconds), but not once the prompt has waited FINISHING_GRACE_S more;
    it never goes before a short prompt, and a reply with more left never before a
    held prompt."""

    def first(now: float, *jobs: JobView) -> JobView:
        return min(jobs, key=lambda j: rules.rank(j, now))

    def reply(now: float, left: int | None) -> JobView:  # it got its last token just now
        return JobView(Phase.DECODING, stepped_at=now, to_decode=left)

    prompt = JobView(Phase.PREFILLING, to_prefill=1800, stepped_at=NOW, arrived=NOW)
    hit = JobView(Phase.PREFILLING, to_prefill=15, stepped_at=NOW, arrived=NOW)
    held, grace, most = NOW + rules.HOLD_S, rules.FINISHING_GRACE_S, rules.FINISHING_TOKENS
    assert first(held, prompt, ending := reply(held, most)) is ending
    assert first(held, prompt, reply(held, most + 1)) is prompt
    assert first(held, prompt, reply(held, None)) is prompt
    assert first(held + grace, prompt, reply(held + grace, most)) is prompt
    assert first(NOW, prompt, ending := reply(NOW, most)) is ending
    assert first(NOW, hit, reply(NOW, 1)) is hit
    # an overdue prompt still goes in the order prompts came
    older = JobView(Phase.PREFILLING, to_prefill=1800, stepped_at=NOW, arrived=NOW - 1)
    assert first(held + rules.FINISHING_GRACE_S, prompt, older) is older


def test_answered_work_goes_in_the_order_the_answers_were_given() -> None:
    """Captures before settling, each in the order the clients got their answers: a
    chat's reply is kept and settled before the background requests a front end sends
    after it, whose answers came later (a draft counts as answered now)."""
    chat = JobView(Phase.SETTLING, answered_at=NOW - 5)
    title = JobView(Phase.SETTLING, answered_at=NOW - 1)
    tags = JobView(Phase.CAPTURING, answered_at=NOW - 0.5)
    draft = JobView(Phase.DRAFTING)
    ranked = sorted([draft, tags, title, chat], key=lambda j: rules.rank(j, NOW))
    assert ranked == [tags, chat, title, draft]


def test_a_contended_prompt_decodes_less_at_a_time() -> None:
    assert rules.decode_limits(512, contended=False) == (512, 0)
    most, piece = rules.decode_limits(512, contended=True)
    assert (most, piece) == (rules.CONTENDED_BATCH_TOKENS, rules.CONTENDED_PIECE_TOKENS)
    assert rules.decode_limits(32, contended=True)[0] == 32  # never more than the tuning's


def test_room_is_made_from_answered_work_what_is_captured_first() -> None:
    """Requests wait and every sequence is taken: work whose client has its answer ends
    now, what has least left first (captured, then not), and only as much as is short;
    a client still waiting is never ended."""
    jobs = [
        JobView(Phase.DECODING),
        JobView(Phase.CAPTURING),
        JobView(Phase.SETTLING),
        JobView(Phase.PREFILLING),
        JobView(Phase.DRAFTING),
    ]
    assert rules.ended_for_room(jobs, 0) == rules.ended_for_room(jobs, -2) == []
    assert rules.ended_for_room(jobs, 2) == [2, 4]
    assert rules.ended_for_room(jobs, 9) == [2, 4, 1]


def test_only_uncaptured_answers_past_the_interval_are_overdue() -> None:
    jobs = [
        JobView(Phase.CAPTURING, answered_at=NOW - 10),
        JobView(Phase.CAPTURING, answered_at=NOW - 1),
        JobView(Phase.SETTLING, answered_at=NOW - 10),
        JobView(Phase.DECODING),
    ]
    assert rules.overdue(jobs, NOW, 5.0) == [0]
    assert rules.overdue(jobs, NOW, 1.0) == [0, 1]


def test_users_are_admitted_in_turn_each_ones_requests_in_order() -> None:
    """The owner with the fewest requests being answered goes first, then the one
    admitted longest ago; one user's burst waits behind itself."""
    owners = ["agent", "agent", "alice", "agent", "bob"]
    assert rules.next_admission(owners, {}, {}) == 0  # nobody answered yet: arrival order
    assert rules.next_admission(owners, {"agent": 1}, {"agent": 1}) == 2
    answering, admitted = {"agent": 1, "alice": 1}, {"agent": 1, "alice": 2}
    assert rules.next_admission(owners, answering, admitted) == 4
    assert rules.next_admission(owners, {}, {"agent": 1, "alice": 2, "bob": 3}) == 0
    assert rules.next_admission(["bob", "bob"], {"bob": 3}, {"bob": 7}) == 0


class _Job:
    """What the worker steps: a prompt of ``batches`` batches of ``size`` tokens, then a
    reply of ``tokens`` tokens; each step is noted in ``log``, and each turn's ending
    in ``ends``."""

    def __init__(
        self,
        name: str,
        batches: int,
        size: int,
        tokens: int,
        log: list[str],
        delay: float = 0,
        release: threading.Event | None = None,
    ) -> None:
        self.name, self.batches, self.size, self.tokens, self.log = name, batches, size, tokens, log
        self.delay = delay  # seconds a batch takes
        self.phase, self.to_prefill, self.to_decode = Phase.WAITING, 0, None
        self.answered_at: float | None = None
        self.arrived = time.monotonic()
        self.next_step = None  # a reply token for the worker to decode (none here)
        self.turn = Turn()
        self.ends: set[EndNow | None] = set()
        self.admitted = SimpleNamespace(session_id=None)
        self.request = SimpleNamespace(owner="")  # one user: served in arrival order
        self.report = SimpleNamespace(
            prompt_tokens=0, completion_tokens=0, restored=dict.fromkeys(TIERS, 0), session_id=None
        )
        self.done = threading.Event()
        # set when its capture starts, which then waits for ``release`` (when given)
        self.capturing, self.release = threading.Event(), release
        self._steps = self.steps()

    def advance(self, turn: Turn, error: BaseException | None = None) -> bool:
        self.turn = turn
        self.ends.add(turn.end)
        try:
            next(self._steps)
        except StopIteration:
            self.phase = Phase.DONE
            return False
        return True

    def steps(self) -> Iterator[None]:
        self.log.append(f"{self.name} claim")
        self.to_prefill, self.phase = self.batches * self.size, Phase.PREFILLING
        yield
        for left in range(self.batches - 1, -1, -1):
            self.log.append(f"{self.name} batch")
            time.sleep(self.delay)
            self.to_prefill = left * self.size
            if left:
                yield
        self.phase = Phase.DECODING
        self.log.append(f"{self.name} first token")
        for _ in range(self.tokens):
            yield
        self.log.append(f"{self.name} answered")
        self.phase, self.answered_at = Phase.CAPTURING, time.monotonic()
        self.done.set()
        yield
        self.capturing.set()
        if self.release is not None:
            assert self.release.wait(30)
        hurried = self.turn.end is EndNow.FOR_ROOM
        self.log.append(f"{self.name} capture" + (" (hurried)" if hurried else ""))
        self.phase = Phase.SETTLING
        yield
        self.log.append(f"{self.name} settled")


def test_a_short_prompt_is_not_held_up_by_a_long_one() -> None:
    engine = FakeEngine(1024, 4, FakeOptions())
    worker = Worker(engine, 4)
    log: list[str] = []
    cold = _Job("cold", batches=8, size=64, tokens=2, log=log)
    hit = _Job("hit", batches=2, size=16, tokens=2, log=log)
    try:
        with worker.lock:  # both wait when the worker looks
            worker.enqueue(cold)  # type: ignore[arg-type]
            worker.enqueue(hit)  # type: ignore[arg-type]
        assert cold.done.wait(30) and hit.done.wait(30)
    finally:
        worker.stop()
        worker.thread.join(30)
    # each claims first; then the hit's batches and first token before any more of
    # the cold prompt's (round robin would have taken turns)
    assert log[:5] == ["cold claim", "hit claim", "hit batch", "hit batch", "hit first token"]
    assert log.index("cold first token") > log.index("hit first token")


@pytest.mark.parametrize("hold_s", [60.0, 0.0])
def test_a_long_prompt_waits_for_the_reply_being_decoded_up_to_hold_s(
    hold_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold prompt that comes while a reply is being decoded waits for the reply's
    end (its prefill would stop the stream for seconds), but not past HOLD_S since it
    came; a short one (a hit) goes before the reply's next token."""
    monkeypatch.setattr(rules, "HOLD_S", hold_s)
    engine = FakeEngine(1024, 4, FakeOptions())
    worker = Worker(engine, 4)
    log: list[str] = []
    streaming, queued = threading.Event(), threading.Event()
    reply = _Job("reply", batches=1, size=16, tokens=20, log=log)
    cold = _Job("cold", batches=4, size=64, tokens=1, log=log)
    hit = _Job("hit", batches=1, size=16, tokens=1, log=log)
    first_token = reply.steps

    def noted() -> Iterator[None]:
        for _ in first_token():
            if reply.phase is Phase.DECODING and not streaming.is_set():
                streaming.set()  # the others come while the reply is being decoded
                assert queued.wait(30)
            yield

    reply._steps = noted()
    try:
        worker.enqueue(reply)  # type: ignore[arg-type]
        assert streaming.wait(30)
        with worker.lock:
            worker.enqueue(cold)  # type: ignore[arg-type]
            worker.enqueue(hit)  # type: ignore[arg-type]
        queued.set()
        assert reply.done.wait(60) and cold.done.wait(60) and hit.done.wait(60)
    finally:
        worker.stop()
        worker.thread.join(30)
    assert log.index("hit first token") < log.index("reply answered")
    if hold_s:
        assert log.index("reply answered") < log.index("cold batch")
    else:
        assert log.index("cold first token") < log.index("reply answered")


def test_a_waiting_request_ends_work_whose_client_has_its_answer() -> None:
    """Every sequence is taken, one by work whose client has its answer: that work
    ends now (captured as it stands) and the waiting request takes its sequence,
    instead of waiting behind it, which runs only while no client waits. What ends
    now (a capture: a KV snapshot) runs without the worker's lock, so an HTTP thread
    admitting another request meanwhile does not wait behind it."""
    engine = FakeEngine(1024, 2, FakeOptions())
    worker = Worker(engine, 2)
    log: list[str] = []
    release = threading.Event()
    first = _Job("first", batches=1, size=16, tokens=1, log=log, release=release)
    busy = _Job("busy", batches=200, size=16, tokens=1, log=log, delay=0.01)
    late = _Job("late", batches=1, size=16, tokens=1, log=log)
    try:
        with worker.lock:
            worker.enqueue(first)  # type: ignore[arg-type]
            worker.enqueue(busy)  # type: ignore[arg-type]
        assert first.done.wait(30)
        worker.enqueue(late)  # type: ignore[arg-type]
        assert first.capturing.wait(30)  # ended for room: its capture is under way
        free = worker.lock.acquire(timeout=10)
        if free:
            worker.lock.release()
        release.set()
        assert late.done.wait(30) and busy.done.wait(30)
        assert worker.wait_idle(30)
    finally:
        release.set()
        worker.stop()
        worker.thread.join(30)
    assert free, "an HTTP thread waited for the worker's lock behind a capture"
    assert EndNow.FOR_ROOM in first.ends
    assert log.index("first capture (hurried)") < log.index("late claim")
    assert log.index("late first token") < log.index("busy first token")
    assert log[-1] == "busy settled"  # its own work, once no client waits


def test_a_job_goes_through_its_phases_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chat request on the real pipeline (fake engine) says where it stands after each
    step: its first step finds what is cached, then its prompt, its reply, the capture
    and the settle; and so does the same request again (a live hit)."""
    from warmstart.runtime.serving._pipeline import Job

    seen: list[Phase] = []
    advance = Job.advance

    def noted(self: Job, turn: Turn, error: BaseException | None = None) -> bool:
        going = advance(self, turn, error)
        if not seen or seen[-1] is not self.phase:
            seen.append(self.phase)
        return going

    monkeypatch.setattr(Job, "advance", noted)
    rt = fake_runtime(tmp_path, FakeOptions(prefill_delay=0.0))
    request = Request(messages=(Message("user", "w " * 40),), sampling=Sampling(max_tokens=3))
    try:
        for _ in range(2):
            rt.generate(request).text()
            assert rt.wait_idle(30)
            order = [Phase.PREFILLING, Phase.DECODING, Phase.CAPTURING, Phase.SETTLING]
            assert seen == [*order, Phase.DONE], seen
            seen.clear()
    finally:
        rt.close()


def _contended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after=None):  # type: ignore[no-untyped-def]
    """A fake runtime whose every step finds other clients waiting, with 256-token
    chunks and a 64-token tile; its prefills are noted as (tokens, ends) in the list
    returned, and ``after(calls, ends)`` runs after each. And a 700-word prompt."""
    monkeypatch.setattr(Worker, "_holds_up", lambda self, job, active: True)
    rt = fake_runtime(
        tmp_path,
        FakeOptions(prefill_delay=0.0),
        chunk_tokens=256,
        batch_tile=64,
        merge_batch_tokens=512,
        n_ctx=2048,
    )
    calls: list[tuple[int, list[int] | None]] = []
    prefill = rt.engine.prefill

    def noted(res, tokens, want_logits, ends=None):  # type: ignore[no-untyped-def]
        done = prefill(res, tokens, want_logits, ends)
        calls.append((len(tokens), None if ends is None else list(ends)))
        if after is not None:
            after(calls, ends)
        return done

    rt.engine.prefill = noted
    words = " ".join(f"w{i % 97}" for i in range(700))
    request = Request(messages=(Message("user", words),), sampling=Sampling(max_tokens=2))
    return rt, calls, request


def test_while_clients_wait_a_long_batch_goes_in_pieces_of_a_tile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While other requests' clients wait, a prompt's batch of the long kind (a tile or
    more) is decoded a piece of about CONTENDED_PIECE_TOKENS at a time, each piece of at
    least a tile, so that the worker turns to the others within a fraction of a second
    instead of after a whole chunk; the sequence still records only the batches' ends,
    and the same prompt again is a whole live hit."""
    rt, calls, request = _contended(tmp_path, monkeypatch)
    try:
        first, report = rt.generate(request).text()
        rt.wait_idle(30)
        n, at, piece_ends = report.prompt_tokens, 0, set()
        for size, ends in calls:  # the prompt's decodes, pieces and all, cover it
            at += size
            if ends == []:
                assert size == rules.CONTENDED_PIECE_TOKENS
                piece_ends.add(at)
            if at == n:
                break
        assert at == n and len(piece_ends) >= 3
        # where a piece ended, no batch did: the sequence records only the batches' ends
        res = next(r for r in rt.engine.residents if r.tokens)
        assert res.bounds[-1] == len(res.tokens) and not piece_ends & set(res.bounds)
        again, report = rt.generate(request).text()
        assert again == first and report.cached_tokens == n
    finally:
        rt.close()


def test_a_cancel_between_pieces_keeps_only_whole_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that leaves after a piece of a batch: the piece ends no batch, so it is
    dropped (the sequence ends at the last batch's end), and the same prompt again
    reuses exactly the whole batches before it."""
    streams: list = []  # type: ignore[type-arg]

    def leave(calls, ends):  # type: ignore[no-untyped-def]
        if len(calls) == 6:  # a piece of the second chunk is in: the client leaves
            assert ends == []
            streams[0].cancel()

    rt, _, request = _contended(tmp_path, monkeypatch, leave)
    try:
        streams.append(rt.generate(request))
        _, report = streams[0].text()
        rt.wait_idle(30)
        assert report.finish_reason == "cancelled"
        res = next(r for r in rt.engine.residents if r.tokens)
        assert res.bounds[-1] == len(res.tokens) == 256  # the first chunk, whole
        _, report = rt.generate(request).text()
        assert report.finish_reason != "cancelled" and report.cached_tokens == 256
    finally:
        rt.close()
