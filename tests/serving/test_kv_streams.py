"""A restore nobody can detect (issue 9), on the real default model.

One KV stream per conversation and prefill batches that do not depend on the cache:
the chunks a prompt leaves in the store are the same bytes whatever was cached
before it, and greedy replies with the cache equal ``--no-cache`` ones, turn after
turn, after a restart and after a SIGKILL.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from warmstart.runtime.types import Message, Request, Sampling

from tests.conftest import SYSTEM, chat, small_settings

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = " ".join(
    f"Item {i}: the {['red', 'green', 'blue', 'amber'][i % 4]} crate on shelf {i % 7} holds "
    f"{3 * i + 1} bolts and {i % 5 + 2} hinges."
    for i in range(60)
)


def _prompt_of(rt, words: list[str], tokens: int) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    """The longest run of ``words`` whose tokens are a prefix of the whole text's and
    number about ``tokens``."""
    whole = rt.engine.model.tokenize(" ".join(words), add_special=True)
    for n in range(len(words), 0, -1):
        text = " ".join(words[:n])
        ids = rt.engine.model.tokenize(text, add_special=True)
        if len(ids) <= tokens and whole[: len(ids) - 1] == ids[:-1]:
            return text, len(ids)
    raise AssertionError("no prefix")


def _chunks(rt, request: Request) -> list[bytes]:  # type: ignore[no-untyped-def]
    from warmstart.runtime.kvstore import TAIL_TOKENS, batch_cuts

    rt.wait_idle()
    ids, anchor = rt.prompter.prompt_ids(request)
    tuning = rt.tuning
    cuts = batch_cuts(len(ids), tuning.chunk_tokens, anchor, TAIL_TOKENS, tuning.batch_tile)[:-1]
    plan = rt.store.prepare_load(ids, cuts)
    try:
        assert len(plan.loads) == len(cuts), "every batch of the prompt is stored"
        return [bytes(blob) for blob in rt.store.load(plan)]
    finally:
        rt.store.complete_load(plan)


def test_chunk_bytes_do_not_depend_on_the_cached_prefix(make_runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    words = DOCUMENT.split()
    cold_rt = make_runtime(tmp_path / "cold", n_ctx=2048)
    text, n = _prompt_of(cold_rt, words, 760)
    assert n > 700
    full = Request(prompt=text, sampling=Sampling(max_tokens=1))
    cold_logits, _ = cold_rt.prompt_logits(full)
    cold = _chunks(cold_rt, full)
    for k, evict in ((24, False), (300, True), (700, False)):
        rt = make_runtime(tmp_path / f"after{k}", n_ctx=2048)
        prefix, got = _prompt_of(rt, words, k)
        assert abs(got - k) <= 12
        rt.prompt_logits(Request(prompt=prefix, sampling=Sampling(max_tokens=1)))
        if evict:
            rt.evict_live()  # the prefix comes back from RAM instead of the live context
        logits, report = rt.prompt_logits(full)
        if k > rt.tuning.chunk_tokens:
            assert report.cached_tokens >= k - rt.tuning.chunk_tokens - 2, report
        assert _chunks(rt, full) == cold, f"after a cached prefix of {got} tokens"
        np.testing.assert_array_equal(logits, cold_logits)


def _turns(*texts: str, system: Message | None = SYSTEM) -> Request:
    return chat(*texts, system=system, max_tokens=16)


def _ask(rt, request: Request) -> str:  # type: ignore[no-untyped-def]
    text, _ = rt.generate(request).text()
    rt.wait_idle()
    return str(text)


KILLED = """
import os, signal, sys
from pathlib import Path
from warmstart.runtime.serving._factory import build_runtime
from warmstart.runtime.types import Message
from tests.conftest import chat, small_settings, SYSTEM
rt = build_runtime(small_settings(Path(sys.argv[1]), Path(sys.argv[2])))
turns = ["Name a large river in Europe.", "The Danube.", "Which countries does it cross?"]
for i in range(2):
    rt.generate(chat(*turns[: 2 * i + 1], max_tokens=16)).text()
    rt.wait_idle()
stream = rt.generate(chat(*turns, "And its length?", max_tokens=64))
next(iter(stream))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_greedy_replies_with_the_cache_equal_no_cache(  # type: ignore[no-untyped-def]
    make_runtime, tmp_path, model_path
) -> None:
    from warmstart.runtime.serving._factory import build_runtime

    oracle = make_runtime(tmp_path / "oracle", no_cache=True)
    data = tmp_path / "cached"
    rt = make_runtime(data)
    asked: list[Request] = []

    def both(request: Request) -> None:
        asked.append(request)
        assert _ask(rt, request) == _ask(oracle, request), request.messages

    # three questions, each asked twice (the second from the live context)
    for q in ("Explain what a cache is.", "What is the capital of Italy?", "Name a prime."):
        both(_turns(q))
        both(_turns(q))
    # a conversation, each turn resending the whole history
    history = ["Give me a word that rhymes with cat."]
    for follow in ("Another one?", "Now one that rhymes with dog."):
        reply = _ask(oracle, _turns(*history))
        both(_turns(*history))
        history += [reply, follow]
    both(_turns(*history))
    # edit and branch: the second question rewritten, then continued
    branch = [*history[:2], "Now one that rhymes with sun."]
    both(_turns(*branch))
    both(_turns(*branch, _ask(oracle, _turns(*branch)), "And with moon?"))
    # the same document, other questions
    doc = Message("system", "Answer from this inventory only. " + DOCUMENT[:1200])
    for q in (
        "How many bolts are in item 4?",
        "Which shelf holds item 9?",
        "What colour is item 2?",
    ):
        both(_turns(q, system=doc))
    rt.evict_live()
    both(_turns("How many hinges are in item 3?", system=doc))  # from RAM
    # a return after a restart: everything from disk
    rt.close()
    rt = build_runtime(small_settings(data, model_path))
    try:
        for request in (
            asked[0],
            _turns(*history),
            _turns("Which shelf holds item 9?", system=doc),
        ):
            text, report = rt.generate(request).text()
            rt.wait_idle()
            assert report.restored["disk"] > 0, report
            assert text == _ask(oracle, request)
    finally:
        rt.close()
    # a replay after SIGKILL in the middle of a reply
    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", KILLED, str(killed), str(model_path)], env=env, cwd=ROOT, timeout=300
    )
    assert proc.returncode == -9
    turns = ["Name a large river in Europe.", "The Danube.", "Which countries does it cross?"]
    with build_runtime(small_settings(killed, model_path)) as again:
        for request in (_turns(turns[0]), _turns(*turns), _turns(*turns, "And its length?")):
            assert _ask(again, request) == _ask(oracle, request)
    assert len(asked) + 6 >= 20


def test_no_cache_is_cold_even_when_the_prompt_is_live(make_runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    oracle = make_runtime(tmp_path / "oracle", no_cache=True)
    request = _turns("What is a KV cache?")
    _ask(oracle, request)
    _, report = oracle.generate(request).text()
    assert report.cached_tokens == 0 and report.decision == "cache off"
    rt = make_runtime(tmp_path / "rt")
    _ask(rt, request)
    _, report = rt.generate(replace(request, use_cache=False)).text()
    assert report.cached_tokens == 0


@pytest.mark.parametrize(("chunk", "most"), [(64, 256), (128, 512), (256, 512)])
def test_merged_batches_only_where_they_give_the_same_bits(  # type: ignore[no-untyped-def]
    make_runtime, tmp_path, chunk, most
) -> None:
    """Whole chunks are prefilled several at a time only where the calibration found
    that this gives each token the KV of one-chunk batches; then the chunks, and the
    logits, are the same bytes as prefilled one chunk at a time."""
    request = Request(prompt=DOCUMENT[:2400], sampling=Sampling(max_tokens=1))
    one = make_runtime(tmp_path / "one", chunk_tokens=chunk, merge_batch_tokens=0, n_ctx=2048)
    invariant = one.on_worker(lambda: one.engine.invariant_units(most, (chunk,)))
    if not invariant:
        pytest.skip("this machine's kernels round a token differently in a larger batch")
    merged = make_runtime(
        tmp_path / "merged", chunk_tokens=chunk, merge_batch_tokens=most, n_ctx=2048
    )
    a, _ = one.prompt_logits(request)
    b, _ = merged.prompt_logits(request)
    np.testing.assert_array_equal(a, b)
    assert _chunks(one, request) == _chunks(merged, request)


def _calibrated_tile(make_runtime, tmp_path: Path) -> int:  # type: ignore[no-untyped-def]
    """The batch tile the calibration finds with this machine's kernels and this
    llama.cpp build (8 in warmstart's, 64 upstream); the test is skipped where none
    holds."""
    from warmstart.runtime.hardware._calibrate import BATCH_TILES

    rt = make_runtime(tmp_path / "kinds")
    for tile in BATCH_TILES:
        if rt.on_worker(lambda tile=tile: rt.engine.batch_kinds(tile)):
            return tile
    pytest.skip("this machine's kernels round a token by its batch's size")


def test_the_build_tiles_short_batches(make_runtime, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The llama.cpp the project's installers build (installers/llama_wheel.py) carries
    warmstart's tag and computes a batch of 8 to 63 tokens in flash-attention tiles,
    with the bytes a long batch gives (upstream's computes it a row at a time, about a
    decode step a token): the calibration then finds a tile of 8."""
    import llama_cpp

    from installers.llama_wheel import PATCH_TAG

    assert llama_cpp.__version__.endswith(f"+warmstart.{PATCH_TAG}"), llama_cpp.__version__
    rt = make_runtime(tmp_path)
    assert rt.on_worker(lambda: rt.engine.batch_kinds(8))


@pytest.mark.parametrize("chunk", [64, 128])
def test_batches_merged_by_kind_give_the_same_bits(make_runtime, tmp_path, chunk) -> None:  # type: ignore[no-untyped-def]
    """Where the calibration found that a token's KV bits depend only on its batch's
    kind (at least ``batch_tile`` tokens, or 2 to one fewer), a prompt's batches of one
    kind are prefilled together: a system prompt's long batches, then its question
    and tail in one decode, and in turn 2, sent at once, the reply's end-of-turn
    markup, the new message and its tail; and with chunks of two tiles or more, the
    batch before a message's end moves back so that it holds a tile. Chunks, logits
    and replies are the same bytes as prefilled one batch at a time, and replies equal
    ``--no-cache``, another question after the same system prompt too."""
    same = dict(chunk_tokens=chunk, batch_tile=_calibrated_tile(make_runtime, tmp_path))
    one = make_runtime(tmp_path / "one", merge_batch_tokens=0, **same)
    merged = make_runtime(tmp_path / "merged", merge_batch_tokens=512, **same)
    oracle = make_runtime(tmp_path / "oracle", merge_batch_tokens=0, no_cache=True, **same)
    system = Message("system", DOCUMENT[:1000])
    messages = (system, Message("user", "Which crate holds the most bolts?"))
    probe = Request(messages=messages, sampling=Sampling(max_tokens=1))
    a, _ = one.prompt_logits(probe)
    b, _ = merged.prompt_logits(probe)
    np.testing.assert_array_equal(a, b)
    assert _chunks(one, probe) == _chunks(merged, probe)
    first = Request(messages=messages, sampling=Sampling(max_tokens=12))
    reply, _ = merged.generate(first).text()
    assert reply == oracle.generate(first).text()[0]
    follow = (*messages, Message("assistant", reply), Message("user", "And the fewest?"))
    second = Request(messages=follow, sampling=Sampling(max_tokens=12))
    again, report = merged.generate(second).text()  # at once: the reply is still settling
    assert again == oracle.generate(second).text()[0]
    assert report.cached_tokens > len(merged.prompter.prompt_ids(probe)[0])
    other = Request(
        messages=(system, Message("user", "Which shelf has crate 7?")),
        sampling=Sampling(max_tokens=12),
    )
    answer, report = merged.generate(other).text()
    assert answer == oracle.generate(other).text()[0]
    # the system prompt and the user's turn markup after it
    header = len(merged.prompter.user_header)
    assert report.cached_tokens == merged.prompter.prompt_ids(probe)[1][0] + header


def test_a_prompt_prefilled_in_pieces_while_others_wait_gives_the_same_bits(  # type: ignore[no-untyped-def]
    make_runtime, tmp_path, monkeypatch
) -> None:
    """While other clients wait, a long batch is decoded in pieces of a tile or more
    (kvstore.piece_end): each token takes the same tiled path as in the whole batch, so
    the chunks stored and the logits are the same bytes as a prefill alone, and the
    reply equals ``--no-cache``."""
    from warmstart.runtime.serving._worker import Worker

    tile = _calibrated_tile(make_runtime, tmp_path)
    same = dict(chunk_tokens=256, batch_tile=tile, merge_batch_tokens=512, n_ctx=2048)
    alone = make_runtime(tmp_path / "alone", **same)
    request = chat("Which crate holds the most bolts?", system=Message("system", DOCUMENT[:1800]))
    probe = replace(request, sampling=Sampling(max_tokens=1))
    a, _ = alone.prompt_logits(probe)
    expected = _chunks(alone, probe)
    monkeypatch.setattr(Worker, "_holds_up", lambda self, job, active: True)
    pieces = make_runtime(tmp_path / "pieces", **same)
    sizes: list[int] = []
    decode = pieces.engine.ctx.decode

    def noted(tokens, *args):  # type: ignore[no-untyped-def]
        sizes.append(len(tokens))
        return decode(tokens, *args)

    pieces.engine.ctx.decode = noted
    b, _ = pieces.prompt_logits(probe)
    assert max(sizes) < 256, sizes  # no whole chunk in one decode
    np.testing.assert_array_equal(a, b)
    assert _chunks(pieces, probe) == expected
    oracle = make_runtime(tmp_path / "oracle", no_cache=True, **same)
    fresh = make_runtime(tmp_path / "fresh", **same)
    assert fresh.generate(request).text()[0] == oracle.generate(request).text()[0]
