"""Which sequence a prompt gets (``Residents.claim``), on the fake engine: the same
bookkeeping drives the llama.cpp one."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from warmstart.runtime.engine._fake import FakeEngine, FakeOptions
from warmstart.runtime.engine._residents import Resident

SHARED = list(range(1000, 1100))  # a system prompt: 100 tokens, one batch


def _held(engine: FakeEngine, tail: list[int]) -> Resident:
    """A conversation that shares SHARED, idle in the first sequence."""
    ids = SHARED + tail
    res, live = engine.claim(ids, [len(SHARED), len(ids)], None, share=True)
    assert live == 0 and res.seq == 0
    assert engine.prefill(res, ids, want_logits=True, ends=[len(SHARED), len(ids)])
    engine.release(res)
    return res


def _other_question(engine: FakeEngine, kept: Callable[[Resident], int]) -> tuple[Resident, int]:
    ids = [*SHARED, 7, 8, 9]
    return engine.claim(ids, [len(SHARED), len(ids)], None, True, len(SHARED), kept)


def test_a_conversation_the_store_keeps_whole_gives_its_sequence_to_another_question() -> None:
    engine = FakeEngine(512, 2, FakeOptions(prefill_delay=0.0))
    held = _held(engine, list(range(80)))  # more than a continuation may drop
    res, live = _other_question(engine, lambda r: len(r.tokens))
    # the shared prefix stays live where it is: no copy, no restore
    assert res is held and live == len(SHARED) and res.tokens == SHARED
    assert res.displaced == (SHARED + list(range(80)), [len(SHARED), len(SHARED) + 80], None)


@pytest.mark.parametrize(
    ("tail", "kept"),
    [
        (list(range(80)), lambda r: len(SHARED)),  # its own tail is not stored
        (list(range(120)), lambda r: len(r.tokens)),  # longer than the prefix it shares
    ],
    ids=["tail-not-stored", "tail-longer-than-shared"],
)
def test_otherwise_it_stays_live_and_another_sequence_loads_the_prefix(
    tail: list[int], kept: Callable[[Resident], int]
) -> None:
    engine = FakeEngine(512, 2, FakeOptions(prefill_delay=0.0))
    held = _held(engine, tail)
    res, live = _other_question(engine, kept)
    assert res is not held and held.tokens == SHARED + tail and res.displaced is None
    assert live == 0  # the store holds the shared prefix: a restore loads it
