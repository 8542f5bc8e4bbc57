"""A capture costs what is new, not the conversation (issue 45, item 2).

After each reply the runtime keeps the chunks the turn added. It used to read the
sequence's whole KV state from llama.cpp to cut them, so a capture cost grew with the
conversation (about 90 ms at 2,000 tokens of a 1B model, 128 KB a token at 8B). Now
it reads only the cells of the chunks it keeps. Counted, not timed: the bytes read
from llama.cpp for the second turn of a chat with 256 and with 2,048 tokens of
history differ only by the new chunks. A model of the real shape at a tiny size (the
synthetic ``tiny`` geometry, one token a character) makes 2,048 tokens cheap here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from warmstart.runtime.engine import _kvblob
from warmstart.runtime.models import synthetic_model
from warmstart.runtime.types import Done, Message, Request, Sampling

from tests.conftest import small_settings

pytestmark = pytest.mark.slow

PAGE = "The stored chunks of a conversation are never read again by a capture. "


def _ask(rt: Any, messages: tuple[Message, ...], ban: tuple[tuple[int, float], ...]) -> Message:
    """A greedy reply of 12 tokens (the end of turn banned: every run decodes as many)."""
    sampling = Sampling(max_tokens=12, logit_bias=ban)
    parts, done = [], None
    for event in rt.generate(Request(messages=messages, sampling=sampling)):
        if isinstance(event, Done):
            done = event
        else:
            parts.append(event.text)
    assert done is not None and done.report.completion_tokens == 12
    assert rt.wait_idle(120)
    return done.reply or Message("assistant", "".join(parts))


def _second_turn(rt: Any, history: int) -> tuple[int, list[tuple[int, int]], int]:
    """A chat whose first message holds ``history`` tokens, answered; then its second
    turn, answered and kept. Returns the KV bytes read from llama.cpp during the second
    turn, the position ranges read, and where the second turn's new message starts."""
    engine = rt.engine
    # replies of printable ASCII but the space, which tokenize back as they were
    # decoded (a space is three bytes, U+2581, in this vocabulary's prompts): so the
    # next prompt's history is the KV already kept, up to its new message
    printable = {engine.model.tokenize(chr(c), False, False)[-1] for c in range(0x21, 0x7F)}
    ban = tuple((t, float("-inf")) for t in range(engine.model.n_vocab) if t not in printable)
    system = Message("system", "Be brief.")
    text = (PAGE * (history // len(PAGE) + 1))[:history]
    messages: tuple[Message, ...] = (system, Message("user", text))
    messages += (_ask(rt, messages, ban), Message("user", "And after that, what then?"))
    start = len(engine.prompter.prompt_ids(Request(messages=messages[:-1]), generation=False)[0])
    spans: list[tuple[int, int]] = []
    snapshot: Callable[..., list[Any]] = engine.snapshot

    def spy(seq: int, c0: int = 0, c1: int = -1) -> list[Any]:
        spans.append((c0, c1))
        return snapshot(seq, c0, c1)

    engine.snapshot = spy
    before = engine.ctx.state_bytes_read
    try:
        _ask(rt, messages, ban)
    finally:
        del engine.snapshot
    return engine.ctx.state_bytes_read - before, spans, start


def test_a_capture_reads_the_new_chunks_whatever_the_history(tmp_path: Path) -> None:
    from warmstart.runtime.serving._factory import build_runtime

    model = synthetic_model("tiny", tmp_path)
    settings = small_settings(tmp_path / "data", model, n_ctx=4096, chunk_tokens=64)
    rt = build_runtime(settings)
    try:
        _compare(rt)
    finally:
        rt.close()


def _compare(rt: Any) -> None:
    layout = rt.engine.layout
    assert rt.engine.ctx.exports_ranges
    cells = {}
    for history in (256, 2048):
        read, spans, start = _second_turn(rt, history)
        assert spans and all(start <= c0 < c1 for c0, c1 in spans), (history, spans, start)
        # exactly those cells: each read is one range's blob, no whole-sequence export
        assert read == sum(_kvblob.assembled_bytes(layout, c1 - c0) for c0, c1 in spans)
        cells[history] = sum(c1 - c0 for c0, c1 in spans)
        # the new message, the reply and its end-of-turn markup: tens of tokens
        assert cells[history] < 100, spans
    # the same turn after 256 or 2,048 tokens of history reads as many cells
    assert cells[256] == cells[2048]
