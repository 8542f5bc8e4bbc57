"""Replies decoded together: eight clients at once, their replies' tokens decoded in
shared llama.cpp batches (where the calibration proved that exact: Tuning.decode_batch),
each reply equal to the same request sent alone to a --no-cache runtime."""

from __future__ import annotations

import threading
from pathlib import Path

from warmstart.runtime.types import Request

from tests.conftest import chat

QUESTIONS = (
    "Name three rivers in Africa.",
    "What is a prime number?",
    "Write one sentence about autumn.",
    "How do bees make honey?",
    "Give me a tip for learning a language.",
    "What does a compiler do?",
    "Describe the colour blue to someone.",
    "Why is the sky dark at night?",
)


def _ask(rt, request: Request) -> str:  # type: ignore[no-untyped-def]
    text, _ = rt.generate(request).text()
    return str(text)


def test_concurrent_replies_in_shared_batches_equal_each_alone(  # type: ignore[no-untyped-def]
    make_runtime, tmp_path: Path
) -> None:
    # the tests' runtimes run on fixed defaults, not calibrated: decode_batch is set as
    # the calibration sets it where its probe held (tests/engine/test_decode_probe.py)
    rt = make_runtime(tmp_path / "batched", resident_sequences=8, decode_batch=8)
    requests = [chat(q, max_tokens=40) for q in QUESTIONS]
    replies: list[str] = [""] * len(requests)
    start = threading.Barrier(len(requests))

    def client(i: int) -> None:
        start.wait()
        replies[i] = _ask(rt, requests[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    stats = rt.stats()
    assert stats["batched_steps"] > 0, stats
    assert stats["batched_tokens"] > 2 * stats["batched_steps"], stats  # not pairs only
    # a step's mean time by its replies, counted as the steps were: one at least shared
    steps = stats["decode_step_ms"]
    assert steps and all(ms > 0 for ms in steps.values()) and max(map(int, steps)) > 2, steps
    rt.close()
    oracle = make_runtime(tmp_path / "oracle", no_cache=True, decode_batch=1)
    for request, reply in zip(requests, replies, strict=True):
        assert reply and reply == _ask(oracle, request), request.messages
