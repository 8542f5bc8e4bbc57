"""/v1/embeddings and /api/embed over HTTP are requests like any other: an unknown
model is a 404 before any work, a client that leaves stops its request, a full queue
is a 429, and SIGTERM during a long request ends the server promptly.

Against the fake server (its embeddings cost ``--prefill-delay`` a word); the real
model's versions are in test_abuse_real.py."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import httpx
import pytest

from tests.timing import slowest, timed

# 600 texts of 100 words (under MAX_EMBED_TOKENS): 60 s of the fake's work at 1 ms a word
LONG = {"model": "default", "input": ["word " * 100] * 600}
SLOW = ("--prefill-delay", "0.001")
POLL_S = 0.05


def _queue(srv: Any) -> dict[str, int]:
    return dict(httpx.get(srv.v1 + "/warmstart/stats", timeout=10).json()["queue"])


def _until(cond: Any, timeout: float = 30.0) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "condition not reached in time"
        time.sleep(POLL_S)
    return time.monotonic() - t0


def _abandoned(url: str, body: dict[str, Any], after_s: float) -> threading.Thread:
    """A request whose client gives up after ``after_s`` seconds (and closes)."""

    def run() -> None:
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(url, json=body, timeout=after_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("route", ["/v1/embeddings", "/api/embed"])
def test_an_unknown_model_is_refused_before_any_work(start: Any, route: str) -> None:
    """Refused sooner than the server computes a thirtieth of that input (twenty of its
    texts, timed just before on this machine): computing first would take 30 times it."""
    with start(fake_args=SLOW) as srv:
        url = srv.base_url + route
        few = {**LONG, "input": LONG["input"][:20]}
        computed, reply = timed(lambda: httpx.post(url, json=few, timeout=60))
        assert reply.status_code == 200, reply.text
        took, reply = timed(lambda: httpx.post(url, json={**LONG, "model": "nope"}, timeout=60))
        assert reply.status_code == 404, reply.text
        assert took < computed, (took, computed)
        assert _queue(srv)["active"] == 0


@pytest.mark.parametrize("route", ["/v1/embeddings", "/api/embed"])
def test_an_abandoned_request_is_stopped(start: Any, route: str) -> None:
    """Freed within ten short requests' time (the slowest of three, timed just before
    on this machine) and a poll, once its client has gone: not the minute its texts
    would take."""
    with start(fake_args=SLOW) as srv:
        short = lambda: httpx.post(srv.v1 + "/embeddings", json={"input": "a"}, timeout=30)  # noqa: E731
        baseline = slowest(short)
        client = _abandoned(srv.base_url + route, LONG, after_s=2.0)
        _until(lambda: _queue(srv)["active"] == 1)
        client.join(10)
        freed = _until(lambda: _queue(srv)["active"] == 0)  # its timeout: a hang guard
        assert freed < 10 * baseline + POLL_S, (freed, baseline)
        assert short().status_code == 200


def test_embeddings_count_and_a_full_queue_gets_429(start: Any) -> None:
    with start("--max-queue", "1", fake_args=SLOW) as srv:
        first = _abandoned(srv.v1 + "/embeddings", LONG, after_s=8.0)
        _until(lambda: _queue(srv)["active"] == 1)
        second = _abandoned(srv.v1 + "/embeddings", LONG, after_s=6.0)
        _until(lambda: _queue(srv)["waiting"] == 1)
        for route, body in (
            ("/embeddings", {"input": "one more"}),
            ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ):
            busy = httpx.post(srv.v1 + route, json=body, timeout=30)
            assert busy.status_code == 429, busy.text
            assert busy.headers["retry-after"]
        first.join(20)
        second.join(20)
        _until(lambda: sum(_queue(srv)[k] for k in ("active", "waiting")) == 0, timeout=10)


def test_sigterm_during_a_long_embedding_ends_the_server(start: Any) -> None:
    """Ends sooner than it started (timed by the fixture, on this machine at its present
    load), not after the minute its texts would take."""
    with start(fake_args=SLOW) as srv:
        client = _abandoned(srv.v1 + "/embeddings", LONG, after_s=60.0)
        _until(lambda: _queue(srv)["active"] == 1)
        took, _ = timed(lambda: (srv.process.terminate(), srv.process.wait(timeout=60)))
        assert took < srv.started_s, (took, srv.started_s)
        assert srv.process.returncode == 0
        client.join(10)
