"""On the real default model: whatever tier a prefix comes from, the next-token logits
are those of a full recompute, and greedy replies are the same with or without the
cache."""

from __future__ import annotations

import numpy as np
import pytest
from warmstart.runtime.types import Message

from tests.conftest import SYSTEM, chat

pytestmark = pytest.mark.slow

Q1 = "What is the capital of France? Tell me one fact about it."
Q2 = "Name three primary colors and say why they are called primary."
HANDBOOK = Message(
    "system",
    SYSTEM.content
    + " You answer questions about the staff handbook: opening hours are nine to five on"
    " weekdays, the office is closed on public holidays, holiday requests go to the team"
    " lead two weeks ahead, expenses are filed within a month with receipts, and the"
    " library lends books for three weeks, renewable once if nobody else asked for them.",
)


def recompute(rt, request):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    logits, report = rt.prompt_logits(replace(request, use_cache=False))
    assert report.cached_tokens == 0
    return logits


def assert_same(a: np.ndarray, b: np.ndarray) -> None:
    """Bit for bit: every prefill computes the same batches, cold or restored, and
    steps through a reply a token at a time, as it was decoded."""
    np.testing.assert_array_equal(a, b)


def test_live_ram_and_disk_hits_equal_recompute(make_runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    req = chat(Q1)
    truth = recompute(rt, req)
    rt.prompt_logits(req)  # cold: computes and captures

    live, report = rt.prompt_logits(req)
    assert report.restored["live"] == report.prompt_tokens  # and the logits it ended with
    assert_same(live, truth)

    rt.evict_live()
    ram, report = rt.prompt_logits(req)
    assert report.restored["ram"] == report.prompt_tokens - 2, report.decision
    assert_same(ram, truth)
    rt.store.flush()
    rt.close()

    fresh = make_runtime()  # a new runtime: empty context, empty pool, same disk
    disk, report = fresh.prompt_logits(req)
    assert report.restored["disk"] == report.prompt_tokens - 2, report.decision
    assert_same(disk, truth)


def test_partial_hit_same_system_prompt_other_question(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    rt.prompt_logits(chat(Q1))
    rt.evict_live()
    other = chat(Q2)
    logits, report = rt.prompt_logits(other)
    assert 0 < report.restored["ram"] < report.prompt_tokens - 2
    assert_same(logits, recompute(rt, other))


def test_another_question_continues_in_place_and_the_chat_it_displaced_is_live_again(
    make_runtime,
) -> None:  # type: ignore[no-untyped-def]
    """The chat the store keeps whole gives its sequence to another question on the same
    system prompt: that prefix stays live (no restore); once the question has its
    answer, the chat is loaded back into an empty sequence, and a return to it is a
    live hit. Both equal a recompute."""
    rt = make_runtime()
    first, other = chat(Q1, system=HANDBOOK, max_tokens=48), chat(Q2, system=HANDBOOK)
    truths = [recompute(rt, first), recompute(rt, other)]
    rt.generate(first).text()  # its reply too: more than a continuation may drop
    rt.wait_idle()  # its chunks are kept
    logits, report = rt.prompt_logits(other)
    assert report.restored["live"] > 0 and report.restored["ram"] == 0, report
    assert_same(logits, truths[1])
    rt.wait_idle()
    back, report = rt.prompt_logits(first)
    # whole: the chunk of its prompt's end kept its logits, and came back with them
    assert report.restored["live"] == report.prompt_tokens, report
    assert_same(back, truths[0])


def test_a_prompt_that_diverges_inside_a_chunk(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime(chunk_tokens=64)
    rt.prompt_logits(chat(Q1))
    rt.evict_live()
    # same question, different ending: diverges inside the last 64-token chunk, which
    # was computed as one batch with the old ending; the restore stops where it began
    near = chat(Q1.replace("one fact", "two facts"))
    _, anchors = rt.prompter.prompt_ids(near)
    logits, report = rt.prompt_logits(near)
    assert 0 < report.restored["ram"] < report.prompt_tokens - 2, report
    assert report.restored["ram"] % 64 == 0 or report.restored["ram"] in anchors
    assert_same(logits, recompute(rt, near))


def test_conversation_resumed_three_turns_later(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    turns: list[str] = []
    for question in ("Hi! Who are you?", "What is 2 + 2?", "And 3 + 3?"):
        turns.append(question)
        text, _ = rt.generate(chat(*turns, max_tokens=12)).text()
        turns.append(text)
    turns.append("Thanks. Now what is 4 + 4?")
    resumed = chat(*turns)
    live, _ = rt.prompt_logits(resumed)
    rt.evict_live()
    logits, report = rt.prompt_logits(resumed)
    assert report.restored["ram"] == report.prompt_tokens - 2, report
    np.testing.assert_array_equal(logits, live)  # bit for bit what the live context had
    assert_same(logits, recompute(rt, resumed))


def test_greedy_replies_identical_with_and_without_cache(make_runtime) -> None:  # type: ignore[no-untyped-def]
    rt = make_runtime()
    replies = []
    for use_cache in (False, True, True):
        text, _ = rt.generate(chat(Q1, max_tokens=24, use_cache=use_cache)).text()
        replies.append(text)
    rt.evict_live()
    text, report = rt.generate(chat(Q1, max_tokens=24)).text()
    assert report.restored["ram"] > 0
    assert replies[0] and replies == [text] * 3


def test_swa_model_is_restored_correctly_or_recomputed(tmp_path, gemma_path) -> None:  # type: ignore[no-untyped-def]
    """Gemma 3 has sliding-window layers (n_swa 512). The prompt is longer than the
    window, where a truncated whole-sequence snapshot would load and be wrong."""
    from warmstart.runtime.serving._factory import build_runtime

    from tests.conftest import small_settings

    settings = small_settings(tmp_path, gemma_path, chunk_tokens=128)
    with build_runtime(settings) as rt:
        assert rt.engine.swa_full and rt.engine.model.n_swa == 512
        long_q = (
            " ".join(
                f"Fact {i}: the number {i} is {'even' if i % 2 == 0 else 'odd'}." for i in range(60)
            )
            + " Which facts mention the number 7?"
        )
        req = chat(long_q, system=None)
        truth = recompute(rt, req)
        live, report = rt.prompt_logits(req)
        assert report.prompt_tokens > 512
        rt.evict_live()
        logits, report = rt.prompt_logits(req)
        # each chunk is cut right after its batch, while the window still holds it
        assert report.restored["ram"] == report.prompt_tokens - 2, report.decision
        np.testing.assert_array_equal(logits, live)
        assert_same(logits, truth)


FRESH = """
import sys
from pathlib import Path
import numpy as np
from warmstart.runtime.serving._factory import build_runtime
from tests.conftest import chat, small_settings
rt = build_runtime(small_settings(Path(sys.argv[1]), Path(sys.argv[2])))
logits, report = rt.prompt_logits(chat(sys.argv[3]))
assert report.restored["disk"] == report.prompt_tokens - 2, report
np.save(sys.argv[4], logits)
rt.close()
"""


def test_disk_hit_in_a_fresh_process_equals_recompute(make_runtime, tmp_path, model_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys
    from pathlib import Path

    rt = make_runtime()
    truth = recompute(rt, chat(Q2))
    rt.prompt_logits(chat(Q2))
    rt.wait_idle()
    rt.store.flush()
    out = tmp_path / "fresh.npy"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run(
        [sys.executable, "-c", FRESH, str(tmp_path), str(model_path), Q2, str(out)],
        check=True,
        env=env,
        cwd=root,
        timeout=300,
    )
    assert_same(np.load(out), truth)
