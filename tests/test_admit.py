"""Admission's rules (runtime/serving/_admit.py), without a model: the real runtime over the
fake engine, which admits as it does over llama.cpp."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from warmstart.runtime.engine._fake import FakeOptions
from warmstart.runtime.errors import ContextOverflow, RequestError
from warmstart.runtime.serving._admit import check_fits, check_request
from warmstart.runtime.serving._core import LocalRuntime
from warmstart.runtime.types import Done, Message, Request, Sampling, Tool

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
