"""Drafts (issue 40, item 1): the prompt a user is still typing is prefilled before
Enter, in the batches a cold run of the final prompt uses, so that the reply after
Enter equals ``--no-cache`` and finds everything that was certain live; drafts are
background work that yields to requests, and a newer draft supersedes an older one.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from warmstart.runtime.serving._draft import plan_draft
from warmstart.runtime.types import Done, Message, Request, Sampling

from tests.conftest import SYSTEM, wait_for
from tests.serving.conftest import answer

pytestmark = pytest.mark.slow

PASTE = " ".join(
    f"Line {i}: the pump at station {i % 7} reported {i * 13 % 101} litres at {i % 24}:00."
    for i in range(40)
)


def _typed(question: str, paste: str = PASTE, session: str | None = "s-paste") -> Request:
    """The chat as the app sends it: the paste and the question typed so far."""
    messages = (SYSTEM, Message("user", f"{paste}\n\n{question}"))
    return Request(messages=messages, sampling=Sampling(max_tokens=12), session_id=session)


@pytest.mark.parametrize("session", ["s-paste", None], ids=["named", "derived"])
def test_paste_then_enter_equals_no_cache_and_finds_the_certain_part_live(
    make_runtime, tmp_path, session
) -> None:  # type: ignore[no-untyped-def]
    """Drafts as the app sends them while the question is typed, then Enter: the
    reply equals --no-cache, and its cached tokens are exactly what the last draft
    said was ready, the edge of what was certain (all but the question's last word
    and the batches after the last aligned end)."""
    rt = make_runtime(tmp_path / "cached")
    oracle = make_runtime(tmp_path / "oracle", no_cache=True)
    final = _typed("Which station reported the most litres?", session=session)
    outcomes = [
        rt.prefill_draft(_typed(q, session=session)) for q in ("", "Which stat", "Which station re")
    ]
    last = outcomes[-1]
    assert last.state == "ready", outcomes
    assert 0 < last.ready == last.certain <= last.prompt_tokens
    assert outcomes[1].cached >= outcomes[0].ready  # each draft goes on from the last
    reply, done = answer(rt, final)
    assert reply.content == answer(oracle, final)[0].content
    assert done.report.cached_tokens == last.ready, (done.report, last)
    # the edge is that of a cold run's batches: everything up to the question's start
    # at least, less than the whole prompt
    assert last.ready < done.report.prompt_tokens


def test_the_certain_part_ends_where_a_cold_run_of_any_longer_text_has_a_batch_end(
    make_runtime, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """The plan's batches are a prefix of the final prompt's own, whatever is typed
    next, so what a draft computes is what a cold prefill of the final prompt does."""
    from warmstart.runtime.kvstore import TAIL_TOKENS, batch_cuts

    rt = make_runtime(tmp_path)
    t = rt.tuning
    draft = _typed("Which station re")
    plan = plan_draft(rt.prompter, draft, t.chunk_tokens, t.batch_tile)
    for more in ("ported", "d", " the most?", "\n\nAnd which the least?"):
        final = _typed("Which station re" + more)
        ids, anchors = rt.prompter.prompt_ids(final)
        cuts = batch_cuts(len(ids), t.chunk_tokens, anchors, TAIL_TOKENS, t.batch_tile)
        assert list(plan.ids[: plan.certain]) == ids[: plan.certain]
        assert list(plan.cuts) == [c for c in cuts if c <= plan.certain], more


def test_a_newer_draft_supersedes_an_older_one(make_runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The older draft of the same conversation stops at its next step; the newer one
    goes on from what the older computed."""
    rt = make_runtime(tmp_path)
    results = {}

    def first() -> None:
        results["old"] = rt.prefill_draft(_typed("Wh"))

    thread = threading.Thread(target=first)
    thread.start()
    assert wait_for(lambda: rt.engine.residents[0].tokens or rt.engine.residents[1].tokens, 60)
    newer = rt.prefill_draft(_typed("Which station"))
    thread.join()
    old = results["old"]
    assert old.state == "superseded", old
    assert old.ready < old.certain
    assert newer.state == "ready"
    assert newer.cached >= old.ready  # nothing the older one computed is done again


def test_drafts_yield_to_another_clients_request(make_runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A request that comes while a draft is being computed stops its decode at once:
    the draft computes nothing more until the request's first token, and the request's
    tokens are those it gets with no draft at all."""
    rt = make_runtime(tmp_path / "cached")
    oracle = make_runtime(tmp_path / "oracle", no_cache=True)
    other = Request(
        messages=(SYSTEM, Message("user", "Name three colours of the rainbow.")),
        sampling=Sampling(max_tokens=12),
        session_id="s-other",
    )
    results = {}
    thread = threading.Thread(target=lambda: results.update(d=rt.prefill_draft(_typed("W"))))
    thread.start()
    progress = lambda: max(len(r.tokens) for r in rt.engine.residents)  # noqa: E731
    assert wait_for(lambda: progress() >= 64, 60)  # the draft has begun
    marks: dict[str, int] = {}
    parts = []
    marks["sent"] = _draft_tokens(rt, "s-paste")
    for event in rt.generate(other):
        if isinstance(event, Done):
            break
        if not parts:
            marks["first"] = _draft_tokens(rt, "s-paste")
        parts.append(event.text)
    thread.join()
    assert "".join(parts) == answer(oracle, other)[0].content
    # the draft's decode in progress at the request's arrival was stopped (it keeps
    # nothing), so at most the batch it had finished meanwhile is in
    step = rt.tuning.merge_batch_tokens or rt.tuning.chunk_tokens
    assert marks["first"] - marks["sent"] <= step, marks
    assert results["d"].state == "ready"  # it went on once the request had its reply


def _draft_tokens(rt, session: str) -> int:  # type: ignore[no-untyped-def]
    return max((len(r.tokens) for r in rt.engine.residents if r.session == session), default=0)


def test_a_draft_of_a_conversation_as_it_stands_brings_it_live(make_runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Selecting an old conversation sends it as it stands: after its chunks left the
    live context, the draft restores them, and the next message finds its whole
    history live."""
    rt = make_runtime(tmp_path)
    first = _typed("Which station reported the most litres?")
    reply, _ = answer(rt, first, wait=True)
    rt.evict_live()
    history = (*first.messages, reply)
    outcome = rt.prefill_draft(replace(first, messages=history))
    assert outcome.state == "ready" and outcome.ready == outcome.certain > 0
    nxt = replace(first, messages=(*history, Message("user", "And the least?")))
    _, done = answer(rt, nxt)
    assert done.report.restored["live"] >= outcome.ready - 3, (done.report, outcome)
