"""Every Runtime (runtime/serving/_service.py) keeps the same contract: LocalRuntime over the
real model, and over the fake engine that ships with the library for the layers
above (the same runtime: queue, sessions, store, stats and rules)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from warmstart.runtime.errors import ContextOverflow, RequestError, WarmstartError
from warmstart.runtime.serving._service import Runtime
from warmstart.runtime.types import Done, Message, Request, Sampling, StoredResponse, Token


@pytest.fixture(params=["fake", "local"])
def runtime(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runtime]:
    if request.param == "fake":
        from tests.conftest import fake_runtime

        rt: Runtime = fake_runtime(tmp_path, n_ctx=512)
    else:
        from warmstart.runtime.serving._factory import build_runtime

        from tests.conftest import small_settings

        model = request.getfixturevalue("model_path")
        rt = build_runtime(small_settings(tmp_path, model, n_ctx=512))
    yield rt
    rt.close()
    rt.close()  # idempotent


def ask(text: str, session: str | None = None, max_tokens: int = 6) -> Request:
    messages = (Message("system", "Be brief."), Message("user", text))
    return Request(messages=messages, sampling=Sampling(max_tokens=max_tokens), session_id=session)


def test_a_stream_is_tokens_then_one_done(runtime: Runtime) -> None:
    assert isinstance(runtime, Runtime)
    events = list(runtime.generate(ask("Say hello.")))
    assert events and all(isinstance(e, Token) for e in events[:-1])
    done = events[-1]
    assert isinstance(done, Done)
    assert done.report.prompt_tokens == runtime.count_tokens(ask("Say hello."))
    assert 0 < done.report.completion_tokens <= 6
    assert done.report.finish_reason in ("stop", "length")


def test_bad_requests_fail_before_any_work(runtime: Runtime) -> None:
    with pytest.raises(RequestError):
        runtime.generate(Request(messages=()))
    with pytest.raises(RequestError):
        runtime.generate(Request(messages=ask("x").messages, sampling=Sampling(max_tokens=0)))
    with pytest.raises(ContextOverflow):
        runtime.generate(ask("word " * 2000))


def test_wait_idle_then_close_refuses_new_work(runtime: Runtime) -> None:
    """What a model switch relies on: it waits for the replies in progress (bounded),
    closes the runtime, and a request that raced it is refused, never left waiting."""
    stream = runtime.generate(ask("Say hello."))
    text = "".join(e.text for e in stream if isinstance(e, Token))
    assert text and runtime.wait_idle(60)
    runtime.close()
    with pytest.raises(WarmstartError):
        runtime.generate(ask("Say hello again."))


def test_cancel_ends_the_stream(runtime: Runtime) -> None:
    stream = runtime.generate(ask("Count from one to one hundred.", max_tokens=200))
    stream.cancel()
    done = [e for e in stream if isinstance(e, Done)]
    assert len(done) == 1 and done[0].report.completion_tokens < 200


def test_sessions_prewarm_delete_stats_settings(runtime: Runtime) -> None:
    runtime.generate(ask("First question.", session="one")).text()  # type: ignore[attr-defined]
    runtime.generate(ask("Second question.", session="two")).text()  # type: ignore[attr-defined]
    ids = [s.id for s in runtime.sessions()]
    assert ids[:2] == ["two", "one"]  # newest first
    info = runtime.session("one")
    assert info is not None and info.location in ("live", "ram", "disk", "none")
    assert runtime.session("nope") is None
    assert runtime.prewarm("nope") == 0
    assert runtime.delete_session("one") is True
    assert runtime.delete_session("one") is False
    stats = runtime.stats()
    for key in ("requests", "hits", "misses", "evictions", "tiers", "queue"):
        assert key in stats
    json.dumps(stats)
    report = runtime.settings_report()
    json.dumps(report)
    assert all({"value", "reason"} <= set(v) for v in report.values())


def test_embed_gives_unit_vectors_equal_for_equal_texts(runtime: Runtime) -> None:
    result = runtime.embed(["The cat sat.", "The cat sat.", "Stocks fell sharply."])
    a, b, c = result.vectors
    assert a == b and a != c
    assert all(abs(sum(x * x for x in v) - 1.0) < 1e-9 for v in result.vectors)
    assert result.prompt_tokens > 0 and result.model == runtime.model_id
    for bad in ([], ["fine", ""]):
        with pytest.raises(RequestError) as refused:
            runtime.embed(bad)
        assert refused.value.param in ("input", "input.1")


def test_rename_and_import_sessions(runtime: Runtime) -> None:
    from warmstart.runtime.types import SessionInfo

    runtime.generate(ask("First question.", session="one")).text()  # type: ignore[attr-defined]
    assert runtime.rename_session("one", "Renamed") is True
    assert runtime.rename_session("nope", "x") is False
    runtime.generate(ask("Again.", session="one")).text()  # type: ignore[attr-defined]
    info = runtime.session("one")
    assert info is not None and info.title == "Renamed"

    messages = (Message("user", "Old question"), Message("assistant", "Old answer"))
    old = SessionInfo("old", "Old chat", 1_700_000_000.0, 1_700_000_100.0, 0, {}, messages)
    assert runtime.import_sessions([old]) == [True]
    assert runtime.import_sessions([old]) == [False]  # repeatable: the first one stays
    got = runtime.session("old")
    assert got is not None and got.title == "Old chat" and got.messages == messages
    assert got.location == "none"
    assert "old" in [s.id for s in runtime.sessions()]
    # the imported conversation goes on like any other
    follow = Request(messages=(*messages, Message("user", "And now?")), session_id="old")
    runtime.generate(follow).text()  # type: ignore[attr-defined]
    got = runtime.session("old")
    assert got is not None and got.title == "Old chat" and len(got.messages) == 4
    # search: titles and message text, case-insensitively
    assert [s.id for s in runtime.sessions("old ANSWER")] == ["old"]
    assert [s.id for s in runtime.sessions("renamed")] == ["one"]
    assert runtime.sessions("50%_off") == []


def test_a_request_without_a_session_is_kept_but_not_listed(runtime: Runtime) -> None:
    """Plain clients name no session: the runtime keeps their conversation (its cache,
    a derived id) out of the list of the user's chats, and lists it on request."""
    runtime.generate(ask("An anonymous question.")).text()  # type: ignore[attr-defined]
    runtime.generate(ask("A named one.", session="mine")).text()  # type: ignore[attr-defined]
    assert runtime.wait_idle(60)
    assert [s.id for s in runtime.sessions()] == ["mine"]
    every = runtime.sessions(anonymous=True)
    assert {s.anonymous for s in every} == {True, False} and len(every) == 2
    hidden = next(s for s in every if s.anonymous)
    found = runtime.session(hidden.id)
    assert found is not None and found.messages[1].content == "An anonymous question."


def test_tokenize_and_pieces_round_trip(runtime: Runtime) -> None:
    text = "Hello world, again and again"
    ids = runtime.tokenize(text)
    assert ids and ids == runtime.tokenize(text)
    assert b"".join(runtime.pieces(ids)).decode() == text
    assert len(runtime.tokenize(text, add_special=True)) >= len(ids)
    with pytest.raises(RequestError) as bad:
        runtime.pieces([10**9])
    assert bad.value.param == "tokens"


def test_responses_are_kept_read_back_and_forgotten(runtime: Runtime) -> None:
    done = list(runtime.generate(ask("Keep me.", session="kept-responses")))[-1]
    assert isinstance(done, Done)
    turns = (*ask("Keep me.").messages[1:], Message("assistant", "Kept."))
    kept = StoredResponse("resp_1", done.report.session_id, True, turns, {"id": "resp_1"})
    assert runtime.keep_response(kept)
    found = runtime.response("resp_1")
    assert found is not None and found.messages == turns and found.body == {"id": "resp_1"}
    assert runtime.response("resp_2") is None
    assert runtime.delete_response("resp_1") and not runtime.delete_response("resp_1")
    assert runtime.keep_response(kept)
    assert runtime.delete_session("kept-responses")
    assert runtime.response("resp_1") is None
