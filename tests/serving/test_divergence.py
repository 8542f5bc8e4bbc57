"""Why a prompt was recomputed, pointed at the text (issue 40, item 2): a request of a
known conversation that reuses less than its last prompt says where it first differs,
with the known patterns named, and never shows another conversation's text."""

from __future__ import annotations

import json

import pytest
from warmstart.runtime.serving._divergence import Previous, explain
from warmstart.runtime.types import Done, Message, Request, Sampling, Tool

from tests.serving.conftest import answer

WEATHER = Tool("get_weather", "The weather in a city.", json.dumps({"type": "object"}))
TIME = Tool("get_time", "The time in a city.", json.dumps({"type": "object"}))


def _system(clock: str) -> Message:
    return Message("system", f"You are a helpful assistant. It is {clock} now. Be brief.")


def _ask(rt, messages, session: str | None, tools=()) -> tuple[Message, Done]:  # type: ignore[no-untyped-def]
    request = Request(
        messages=tuple(messages), sampling=Sampling(max_tokens=8), session_id=session, tools=tools
    )
    return answer(rt, request, wait=True)


def test_the_pure_rule_names_the_message_the_offset_and_both_texts() -> None:
    old = (_system("12:02"), Message("user", "Hi"))
    new = Request(messages=(_system("12:03"), Message("user", "Hi"), Message("user", "Hm")))
    found = explain(Previous(old, (), "fp", 40), new, "fp", 30)
    assert found is not None
    text = old[0].content
    assert (found.where, found.offset) == ("system message", text.index("12:02") + 4)
    assert (found.old, found.new) == ("12:02 now. B", "12:03 now. B")
    assert found.pattern == "time in the system prompt" and "system prompt" in (found.fix or "")
    assert found.text().startswith(f'system message, character {found.offset}: "12:03')


def test_a_question_asked_again_is_no_divergence() -> None:
    """`warmstart ask` twice, or a regenerate: the conversation stored after the first
    holds the reply too, and the request is that conversation less its reply."""
    asked = (_system("12:02"), Message("user", "Hi"))
    previous = Previous((*asked, Message("assistant", "Hello!")), (), "fp", 40)
    assert explain(previous, Request(messages=asked), "fp", 2) is None


def test_the_pure_rule_names_a_changed_model() -> None:
    messages = (Message("user", "Hi"),)
    found = explain(Previous(messages, (), "old", 10), Request(messages=messages), "new", 10)
    assert found is not None and found.pattern == "changed model"


@pytest.mark.slow
def test_a_clock_in_the_system_prompt_is_named_with_its_fix(make_runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime(tmp_path)
    first = [_system("12:02"), Message("user", "Name a colour.")]
    reply, done = _ask(rt, first, "s-clock")
    assert done.report.divergence is None
    second = [_system("12:03"), first[1], reply, Message("user", "Another one?")]
    _, done = _ask(rt, second, "s-clock")
    d = done.report.divergence
    assert d is not None, done.report
    assert d["where"] == "system message" and d["message"] == 0
    assert d["offset"] == first[0].content.index("12:02") + 4
    assert "12:02" in d["old"] and "12:03" in d["new"]
    assert d["pattern"] == "time in the system prompt"
    assert d["tokens"] > 0
    assert "recomputed from system message" in done.report.summary()
    said = rt.session("s-clock").divergence  # what warmstart sessions show prints
    assert said is not None and said.startswith("system message, character")


@pytest.mark.slow
def test_tools_sent_in_another_order_are_named(make_runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime(tmp_path)
    first = [Message("user", "Say hello.")]
    reply, _ = _ask(rt, first, "s-tools", tools=(WEATHER, TIME))
    second = [*first, reply, Message("user", "Again.")]
    _, done = _ask(rt, second, "s-tools", tools=(TIME, WEATHER))
    d = done.report.divergence
    assert d is not None, done.report
    assert d["where"] == "tools" and d["pattern"] == "tools in another order"
    assert (d["old"], d["new"]) == ("get_weather, get_time", "get_time, get_weather")


@pytest.mark.slow
def test_no_text_of_another_conversation_is_shown(make_runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Another conversation's last prompt is never compared: named ones by their own id
    only; unnamed ones by their opening, and then only a system prompt is compared."""
    rt = make_runtime(tmp_path)
    secret = Message("user", "My locker code is ALPHA-7731. Name a colour.")
    reply, _ = _ask(rt, [_system("12:02"), secret], "s-a")
    # another named conversation with the same system prompt, changed
    _, done = _ask(rt, [_system("12:03"), Message("user", "Name a fruit.")], "s-b")
    assert done.report.divergence is None
    # unnamed: the same opening, then other text than the first conversation's
    unnamed = [_system("12:02"), secret, reply]
    _ask(rt, [*unnamed, Message("user", "And its price?")], None)
    other = [_system("12:02"), secret, Message("assistant", "Blue."), Message("user", "Why?")]
    _, done = _ask(rt, other, None)
    assert done.report.divergence is None  # (beyond the opening: maybe another's text)


def test_another_users_conversation_of_the_same_id_is_never_compared() -> None:
    """Per-user keys: two people may name a conversation alike; each one's previous
    prompt is theirs only (owner and cache scope are part of its name)."""
    from warmstart.runtime.serving._admit import Admitted
    from warmstart.runtime.serving._divergence import Prompts

    def admitted(owner: str, clock: str) -> Admitted:
        request = Request(
            messages=(_system(clock), Message("user", f"{owner}'s secret question")),
            session_id="s1",
            owner=owner,
            cache_scope=owner,
        )
        return Admitted(request, tuple(range(60)), (), "s1", None, "fp")

    prompts = Prompts()
    prompts.remember(admitted("alice", "12:02"), Message("assistant", "A."), "fp")
    assert prompts.explain(admitted("bob", "12:03"), 10, "fp") is None
    found = prompts.explain(admitted("alice", "12:03"), 10, "fp")
    assert found is not None and found.where == "system message"
    assert prompts.last_said("bob", "s1") is None
