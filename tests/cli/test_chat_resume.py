"""`/resume` in `warmstart chat`: an unknown id is an error that keeps the conversation
under way; a unique prefix of an id resumes that conversation (no model: the runtime
over the fake engine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from warmstart.runtime.cli._chat import ChatLoop
from warmstart.runtime.engine._fake import FakeOptions
from warmstart.runtime.serving._core import LocalRuntime
from warmstart.runtime.types import Done, Message, Request

from tests.conftest import fake_runtime


def _reply(stream: Any) -> Any:
    return next((e.report for e in stream if isinstance(e, Done)), None)


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[LocalRuntime]:
    runtime = fake_runtime(tmp_path, FakeOptions(prefill_delay=0.0))
    for sid, text in (("4ecb1d2e3f40", "Plan a trip to Rome."), ("4e77aa001122", "Hi")):
        runtime.generate(Request(messages=(Message("user", text),), session_id=sid)).text()
    yield runtime
    runtime.close()


def _loop(rt: LocalRuntime, *lines: str, session: str | None = None) -> ChatLoop:
    typed = iter(lines)

    def read(_prompt: str) -> str:
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None

    return ChatLoop(rt, session, "", 8, 0.0, print_reply=_reply, read=read)


def test_an_unknown_id_is_an_error_and_the_conversation_goes_on(
    rt: LocalRuntime, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = _loop(rt, "First words.", "/resume nope", "Second words.")
    started = loop.session_id
    assert loop.run() == 0
    err = capsys.readouterr().err
    assert "no conversation nope" in err and f"still in {started}" in err
    assert "starting it" not in err
    assert loop.session_id == started
    assert [m.content for m in loop.messages if m.role == "user"] == [
        "First words.",
        "Second words.",
    ]
    assert rt.session("nope") is None  # nothing was created under the typo


def test_a_unique_prefix_resumes_and_an_ambiguous_one_says_which(
    rt: LocalRuntime, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = _loop(rt, "/resume 4e", "/resume 4ecb")
    loop.run()
    err = capsys.readouterr().err
    assert "'4e' starts the ids of 2 conversations" in err
    assert "4ecb1d2e3f40" in err and "4e77aa001122" in err
    assert "resumed 4ecb1d2e3f40: Plan a trip to Rome." in err
    assert loop.session_id == "4ecb1d2e3f40"
    assert loop.messages[0].content == "Plan a trip to Rome."


def test_a_new_session_name_still_starts_a_conversation(
    rt: LocalRuntime, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = _loop(rt, session="holiday")
    assert loop.session_id == "holiday" and not loop.messages
    assert "no conversation holiday; starting it" in capsys.readouterr().err
