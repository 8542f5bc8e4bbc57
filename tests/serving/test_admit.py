"""Admission's rules (runtime/serving/_admit.py), without a model: the real runtime over the
fake engine, which admits as it does over llama.cpp."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from warmstart.runtime.engine._fake import FakeOptions
from warmstart.runtime.errors import Busy, ContextOverflow, RequestError
from warmstart.runtime.serving._admit import check_fits, check_request
from warmstart.runtime.serving._core import LocalRuntime
from warmstart.runtime.types import Budget, Done, Message, Request, Sampling, Tool

from tests.conftest import fake_runtime

HELLO = (Message("user", "hello"),)


FAST = FakeOptions(n_ctx=64, prefill_delay=0.0)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[LocalRuntime]:
    runtime = fake_runtime(tmp_path, FAST)
    yield runtime
    runtime.close()


@pytest.mark.parametrize(
    "request_,param",
    [
        (Request(), "messages"),
        (Request(messages=HELLO, prompt="hi"), "prompt"),
        (Request(prompt=""), "prompt"),
        (Request(messages=(Message("robot", "x"),)), "messages.0.role"),  # type: ignore[arg-type]
        (Request(messages=HELLO, sampling=Sampling(top_p=0.0)), "top_p"),
        (Request(messages=HELLO, sampling=Sampling(temperature=float("nan"))), "temperature"),
        (Request(messages=HELLO, sampling=Sampling(max_tokens=0)), "max_tokens"),
        (Request(messages=HELLO, tools=(Tool("f"),), tool_choice="g"), "tool_choice"),
        (Request(messages=HELLO, tool_choice="required"), "tool_choice"),
        (Request(messages=HELLO, session_id="a/b"), "session_id"),
    ],
)
def test_each_rule_names_its_field(request_: Request, param: str) -> None:
    with pytest.raises(RequestError) as caught:
        check_request(request_)
    assert (caught.value.param or "").startswith(param)


def test_the_overflow_rule_is_the_prompt_alone() -> None:
    check_fits(63, 500, 64)  # room for one reply token: admitted, the reply stops there
    with pytest.raises(ContextOverflow):
        check_fits(64, 1, 64)


def test_an_overflow_with_tools_says_their_definitions_count() -> None:
    """A tool's parameter schema is part of the prompt: a large one fills the context
    by itself, and the error must not send the user to a conversation of one line."""
    with pytest.raises(ContextOverflow, match=r"tokens \(the tools' definitions included\)"):
        check_fits(64, 1, 64, tools=True)
    with pytest.raises(ContextOverflow) as caught:
        check_fits(64, 1, 64)
    assert "tools" not in str(caught.value)


def test_a_reply_that_runs_past_the_context_stops_there(fake: LocalRuntime) -> None:
    words = " ".join(["word"] * 50)
    admitted = fake.admit(
        Request(messages=(Message("user", words),), sampling=Sampling(max_tokens=8))
    )
    assert fake.count_tokens(admitted.request) == len(admitted.ids)
    roomy = admitted.with_max_tokens(500)  # prompt + max_tokens past the context
    done = list(fake.generate(roomy))[-1]
    assert isinstance(done, Done)
    assert done.report.completion_tokens <= 64 - len(admitted.ids)


def test_trim_keeps_the_system_prompt_and_the_last_turns(
    fake: LocalRuntime, tmp_path: Path
) -> None:
    long = " ".join(["word"] * 20)
    turns = [Message("system", "be brief")]
    for i in range(4):
        turns += [Message("user", f"{long} {i}"), Message("assistant", "ok")]
    turns.append(Message("user", "last"))
    admitted = fake.admit(Request(messages=tuple(turns), sampling=Sampling(max_tokens=8)))
    assert admitted.trimmed > 0 and admitted.history == tuple(turns)
    kept = admitted.request.messages
    assert kept[0] == turns[0] and kept[-1] == turns[-1] and kept[1].role == "user"
    assert len(admitted.ids) <= 64 - 8
    error_only = fake_runtime(tmp_path / "error", FAST, overflow="error")
    try:
        with pytest.raises(ContextOverflow):
            error_only.admit(replace(admitted.request, messages=tuple(turns)))
    finally:
        error_only.close()


def _untokenized(runtime: LocalRuntime, monkeypatch: pytest.MonkeyPatch) -> list[Request]:
    """The requests the prompter was asked to tokenize, from now on."""
    seen: list[Request] = []
    tokenize = runtime.prompter.prompt_ids

    def spy(request: Request, *args: object, **kwargs: object) -> object:
        seen.append(request)
        return tokenize(request, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runtime.prompter, "prompt_ids", spy)
    return seen


def test_a_prompt_bounded_over_the_context_is_refused_untokenized(
    fake: LocalRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A megabyte tokenized takes seconds of a core that other clients wait for: a
    proven lower bound on its tokens refuses it first, with the same error."""
    tokenized = _untokenized(fake, monkeypatch)
    huge = " ".join(["word"] * 200)
    for request in (chat_of(Message("user", huge)), Request(prompt=huge)):
        with pytest.raises(ContextOverflow, match="at least 200 tokens"):
            fake.admit(request)
    last_turn = (Message("system", "be brief"), Message("user", "hi"), Message("assistant", "ok"))
    with pytest.raises(ContextOverflow):  # trimming keeps the last turn: still over
        fake.admit(chat_of(*last_turn, Message("user", huge)))
    assert tokenized == []
    # an early turn over the context is trimmed away, not refused
    admitted = fake.admit(chat_of(Message("user", huge), *last_turn[1:], Message("user", "and?")))
    assert admitted.request.messages[0].content == "hi" and len(tokenized) >= 1


def chat_of(*messages: Message) -> Request:
    return Request(messages=messages, sampling=Sampling(max_tokens=8))


def test_a_budget_left_open_is_sized_once_from_the_prompt(fake: LocalRuntime) -> None:
    """The prompt is fitted with one reply token (the most of it kept), then the reply
    gets the room left, at most ``most``; a requested budget is kept as asked."""
    request = chat_of(Message("user", " ".join(["word"] * 20)))
    room = 64 - len(fake.admit(request).ids)
    assert fake.admit(request, Budget()).request.sampling.max_tokens == room
    assert fake.admit(request, Budget(most=5)).request.sampling.max_tokens == 5
    assert fake.admit(request, Budget(requested=30)).request.sampling.max_tokens == 30


def test_count_tokens_is_the_whole_conversation_before_any_trim(fake: LocalRuntime) -> None:
    long = " ".join(["word"] * 20)
    turns: list[Message] = []
    for i in range(4):
        turns += [Message("user", f"{long} {i}"), Message("assistant", "ok")]
    request = chat_of(*turns, Message("user", "last"))
    admitted = fake.admit(request)
    assert admitted.trimmed > 0
    assert fake.count_tokens(request) > len(admitted.ids)
    assert fake.count_tokens(request) > 64  # over the context: counted, not refused


def test_count_tokens_queues_nothing(tmp_path: Path) -> None:
    """A full queue refuses a reply (Busy), never a count."""
    runtime = fake_runtime(
        tmp_path, FakeOptions(token_delay=0.05), max_queue=1, resident_sequences=1
    )
    streams = []
    try:
        with pytest.raises(Busy):
            for i in range(5):
                streams.append(runtime.generate(chat_of(Message("user", f"b{i}"))))
        assert runtime.count_tokens(chat_of(Message("user", "hello"))) > 0
    finally:
        for stream in streams:
            stream.cancel()
            list(stream)
        runtime.close()
