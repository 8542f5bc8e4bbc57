"""A restored repeat decodes nothing (issue 45): the store keeps a prompt's last batch
with the next-token logits it gave, so the same request restored from the RAM pool, or
from disk after a restart, samples its first token from them, as a live repeat does.
Counted, not timed; every reply equals ``--no-cache``."""

from __future__ import annotations

import pytest
from warmstart.runtime.types import Done, Request

from tests.conftest import chat
from tests.serving.conftest import answer

pytestmark = pytest.mark.slow

QUESTION = "Name a colour and say one thing about it."


def _prompt_decodes(rt, n_ids: int) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    """(start, tokens) of every decode of ``rt``'s engine that computes prompt tokens
    (starts before ``n_ids``); a reply's tokens start after them."""
    decodes: list[tuple[int, int]] = []
    prefill = rt.engine.prefill

    def counted(res, tokens, want_logits=True, ends=None):  # type: ignore[no-untyped-def]
        if len(res.tokens) < n_ids:
            decodes.append((len(res.tokens), len(tokens)))
        return prefill(res, tokens, want_logits, ends)

    rt.engine.prefill = counted
    return decodes


def _same(rt, oracle, request: Request) -> Done:  # type: ignore[no-untyped-def]
    reply, done = answer(rt, request, wait=True)
    assert reply.content == answer(oracle, request)[0].content
    return done


def test_a_repeat_restored_from_ram_or_after_a_restart_decodes_nothing(  # type: ignore[no-untyped-def]
    make_runtime, tmp_path
) -> None:
    same = dict(batch_tile=8, merge_batch_tokens=512)
    oracle = make_runtime(tmp_path / "oracle", no_cache=True, **same)
    request = chat(QUESTION, max_tokens=8)
    rt = make_runtime(tmp_path / "cached", **same)
    n_ids = len(rt.prompter.prompt_ids(request)[0])
    _same(rt, oracle, request)  # cold: its last batch is kept with its logits

    rt.evict_live()  # another chat took the sequence: the repeat comes from RAM
    decodes = _prompt_decodes(rt, n_ids)
    done = _same(rt, oracle, request)
    assert done.report.restored["ram"] == n_ids, done.report.decision
    assert done.report.prefilled_tokens == 0 and decodes == [], decodes
    rt.store.flush()
    rt.close()

    fresh = make_runtime(tmp_path / "cached", **same)  # a restart: same data dir
    decodes = _prompt_decodes(fresh, n_ids)
    done = _same(fresh, oracle, request)
    assert done.report.restored["disk"] == n_ids, done.report.decision
    assert done.report.prefilled_tokens == 0 and decodes == [], decodes
    # the next turn goes on from there: it restores or holds the prompt, never worse
    nxt = chat(QUESTION, "Blue.", "And another one?", max_tokens=8)
    assert _same(fresh, oracle, nxt).report.cached_tokens >= n_ids


def test_without_its_logits_the_last_batch_is_recomputed(make_runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A store whose last chunk of the prompt keeps no logits (kept before they were,
    or its logits proved corrupt and the chunk was dropped) restores up to the batch
    before and recomputes that one: one decode, the same reply."""
    same = dict(batch_tile=8, merge_batch_tokens=512)
    oracle = make_runtime(tmp_path / "oracle", no_cache=True, **same)
    request = chat(QUESTION, max_tokens=8)
    rt = make_runtime(tmp_path / "cached", **same)
    ids = rt.prompter.prompt_ids(request)[0]
    _same(rt, oracle, request)
    rt.evict_live()
    last = next(r for r in rt.store.ledger.records.values() if r.end == len(ids))
    assert last.logits == 4 * rt.engine.model.n_vocab
    rt.store.flush()  # (its write done: nothing pins it)
    assert rt.store.drop([last.key]) == 1  # as a read that found it corrupt does
    decodes = _prompt_decodes(rt, len(ids))
    done = _same(rt, oracle, request)
    assert done.report.restored["ram"] == last.start, done.report.decision
    assert [start for start, _ in decodes] == [last.start], decodes
    # kept again, with its logits this time: the next repeat decodes nothing
    rt.evict_live()
    decodes.clear()
    done = _same(rt, oracle, request)
    assert done.report.restored["ram"] == len(ids) and decodes == [], decodes
