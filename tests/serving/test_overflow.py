"""A conversation longer than the context: trimmed (the system prompt and the most
recent turns that fit stay) and answered, or refused with overflow = error."""

from __future__ import annotations

import pytest
from warmstart.runtime.errors import ContextOverflow
from warmstart.runtime.types import Message, Request, Sampling

from tests.conftest import SYSTEM

pytestmark = pytest.mark.slow


def _long_chat(rt, turns: int = 30) -> Request:  # type: ignore[no-untyped-def]
    messages = [SYSTEM]
    for i in range(turns):
        messages.append(Message("user", f"Tell me fact number {i} about the sea. " * 5))
        messages.append(Message("assistant", f"Fact {i}: the sea is deep and wide. " * 5))
    messages.append(Message("user", "Which fact came last?"))
    request = Request(messages=tuple(messages), sampling=Sampling(max_tokens=16), session_id="long")
    assert len(rt.prompter.prompt_ids(request)[0]) > 3 * rt.n_ctx  # three contexts' worth
    return request


def test_a_chat_three_times_the_context_is_trimmed_and_answered(make_runtime) -> None:  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient
    from warmstart.runtime.api import create_app

    rt = make_runtime()
    request = _long_chat(rt)
    text, report = rt.generate(request).text()
    assert text.strip()
    assert report.trimmed_messages > 0
    assert report.prompt_tokens + 16 <= rt.n_ctx
    assert "left out to fit" in report.summary()  # the CLI's line
    rt.wait_idle(60)
    # the session keeps the whole conversation, not the part that fitted
    assert len(rt.session("long").messages) == len(request.messages) + 1

    client = TestClient(create_app(rt.settings, rt), base_url="http://localhost")
    body = {
        "messages": [{"role": m.role, "content": m.content} for m in request.messages],
        "max_tokens": 8,
    }
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["x_warmstart"]["trimmed_messages"] > 0


def test_overflow_error_keeps_the_400(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime(overflow="error")
    with pytest.raises(ContextOverflow):
        rt.generate(_long_chat(rt))
