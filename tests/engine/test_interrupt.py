"""Background work never holds a request up (issue 18, item 2).

Background prefill (a raw completion's reply, re-prefilled in the batches a longer
prompt holds) runs after its client has the answer; a request that arrives meanwhile
stops that decode within one graph node (llama.cpp's abort callback, read
without Python), and the batch is redone after the request, so nothing is lost and
nothing computed twice is kept.
"""

from __future__ import annotations

import threading

import pytest
from warmstart.runtime.types import Request, Sampling

from tests.conftest import chat, wait_for

pytestmark = pytest.mark.slow


def test_an_interrupted_prefill_keeps_nothing_and_can_be_redone(  # type: ignore[no-untyped-def]
    make_runtime,
) -> None:
    rt = make_runtime()
    engine = rt.engine

    def run() -> None:
        res, _ = engine.claim([], [], None, share=False)
        try:
            ids = engine.model.tokenize("A long text to prefill. " * 40, add_special=True)
            engine.interrupt(True)
            assert not engine.prefill(res, ids, want_logits=False)
            assert res.tokens == [] and engine.ctx.seq_pos_max(res.seq) == -1
            engine.interrupt(False)
            assert engine.prefill(res, ids, want_logits=False)
            assert engine.ctx.seq_pos_max(res.seq) == len(ids) - 1
        finally:
            engine.evict(res, counted=False)
            engine.release(res)

    rt.worker.call(run)
    assert engine.interruptions == 1


def test_a_request_stops_a_reply_re_prefill_that_is_then_redone(  # type: ignore[no-untyped-def]
    make_runtime, tmp_path
) -> None:
    """A raw completion's reply is re-prefilled in the aligned batches a longer prompt
    holds (it has no assistant turn to step through): a chat that arrives meanwhile
    stops that batch, and it is redone after it."""
    rt = make_runtime(tmp_path / "cached", chunk_tokens=128)
    oracle = make_runtime(tmp_path / "oracle", no_cache=True)
    first = Request(
        prompt="Once upon a time, a lighthouse keeper", sampling=Sampling(max_tokens=160)
    )
    text, _ = rt.generate(first).text()
    # the re-prefill of the first 128 tokens is running now: another chat arrives
    assert wait_for(lambda: rt.worker.in_background and rt.engine.decoding > 100, timeout=60)
    other = chat("Name a prime number.")
    got = {}
    thread = threading.Thread(target=lambda: got.update(r=rt.generate(other).text()))
    thread.start()
    thread.join(timeout=300)
    assert rt.engine.interruptions >= 1
    rt.wait_idle()
    assert got["r"][0] == oracle.generate(other).text()[0]
    # the re-prefill was redone after it: a longer prompt finds that batch
    follow = Request(prompt=first.prompt + text + " The end.", sampling=other.sampling)
    reply, report = rt.generate(follow).text()
    rt.wait_idle()
    assert reply == oracle.generate(follow).text()[0]
    assert sum(report.restored.values()) >= 128, report
