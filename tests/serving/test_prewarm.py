"""Prewarm at startup: recent conversations come back from disk to RAM in the
background, within the pool, and the first request does not wait for it."""

from __future__ import annotations

import pytest
from warmstart.runtime.serving._factory import start_prewarm

from tests.conftest import chat

pytestmark = pytest.mark.slow


def test_recent_conversations_are_prewarmed_into_ram(make_runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    first = make_runtime()
    for sid, q in (("old", "What is a prime number?"), ("new", "What is a square number?")):
        first.generate(chat(q, max_tokens=6, session_id=sid)).text()
    first.store.flush()
    first.close()

    rt = make_runtime()
    before = {s.id: s.tiers for s in rt.sessions()}
    assert before["new"]["ram"] == 0 and before["new"]["disk"] > 0
    thread = start_prewarm(rt, 1)  # only the most recent one
    # served meanwhile (another system prompt: it shares nothing with the two chats)
    text, report = rt.generate(chat("Hello!", max_tokens=4, system=None)).text()
    assert text
    thread.join(timeout=60)
    after = {s.id: s.tiers for s in rt.sessions()}
    assert after["new"]["ram"] > 0  # promoted from disk
    # only the most recent was asked for: the other one's own chunk stays on disk
    assert after["old"]["disk"] > 0 and after["old"]["ram"] < after["new"]["ram"]
    _, report = rt.prompt_logits(chat("What is a square number?"))
    assert report.restored["ram"] > 0 and report.restored["disk"] == 0
