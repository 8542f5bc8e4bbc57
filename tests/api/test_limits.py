"""Work is bounded before it starts, and a client that leaves or stops reading stops
costing the server (real server processes on loopback)."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import httpx
import pytest
from warmstart.runtime.engine._fake import FakeOptions

from tests.api.conftest import refusal_times
from tests.api.stopped import cancel_bound, seconds_to_receive, stream_raw, unread
from tests.timing import slowest

BIG_CTX = ("--n-ctx", "4000000")
WORDS = 200_000
PREFILL_S = WORDS * FakeOptions().prefill_delay  # what the fake sleeps to prefill them
POLL_S = 0.05


def _active(srv: Any) -> int:
    return int(httpx.get(srv.v1 + "/warmstart/stats", timeout=10).json()["queue"]["active"])


def _free_within(srv: Any, seconds: float) -> float:
    """Seconds until no generation is active and a small chat is answered."""
    t0 = time.monotonic()
    while _active(srv) and time.monotonic() - t0 < seconds:
        time.sleep(POLL_S)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(srv.v1 + "/chat/completions", json=body, timeout=30).status_code == 200
    return time.monotonic() - t0


def test_fifty_thousand_messages_are_refused_fast(server: Any) -> None:
    """Refused before any template or token (see refusal_times)."""
    messages = [{"role": "user", "content": "hi"}] * 50_000
    url = server.v1 + "/chat/completions"
    response, refused, parsed = refusal_times(url, {"messages": messages})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "too_many_messages"
    assert response.json()["error"]["param"] == "messages"
    assert refused < 3 * parsed, (refused, parsed)


def test_prompt_characters_are_bounded(start: Any) -> None:
    env = {"WARMSTART_MAX_PROMPT_CHARS": "1000", "WARMSTART_MAX_MESSAGES": "3"}
    with start(env=env) as srv:
        chat = srv.v1 + "/chat/completions"
        long = {"messages": [{"role": "user", "content": "x" * 600}] * 2}
        error = httpx.post(chat, json=long).json()["error"]
        assert (error["code"], error["param"]) == ("prompt_too_long", "messages")
        prompt = httpx.post(srv.v1 + "/completions", json={"prompt": "y" * 1001}).json()
        assert prompt["error"]["code"] == "prompt_too_long"
        four = {"messages": [{"role": "user", "content": "x"}] * 4}
        assert httpx.post(chat, json=four).json()["error"]["code"] == "too_many_messages"
        three = {"messages": [{"role": "user", "content": "x"}] * 3, "max_tokens": 2}
        assert httpx.post(chat, json=three).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_an_abandoned_megabyte_request_frees_the_server(start: Any, stream: bool) -> None:
    """1 MB of prompt takes the fake PREFILL_S (~40 s) to prefill; its client gives up
    after 3 s. Freed within ten small chats' time (the slowest of three, timed just
    before on this machine) and a poll."""
    with start(fake_args=BIG_CTX) as srv:
        baseline = slowest(lambda: _free_within(srv, 0))
        words = "word " * WORDS
        body = {"messages": [{"role": "user", "content": words}], "stream": stream}
        body["max_tokens"] = 4
        assert len(json.dumps(body)) > 1_000_000
        url = srv.v1 + "/chat/completions"
        with pytest.raises(httpx.ReadTimeout), httpx.stream("POST", url, json=body, timeout=3) as r:
            for _ in r.iter_bytes():
                pass
        # a server that finished the prefill first would take all of PREFILL_S
        freed = _free_within(srv, PREFILL_S)  # its limit: a hang guard
        assert freed < 10 * baseline + POLL_S, (freed, baseline)


TALK = {"messages": [{"role": "user", "content": "talk"}], "stream": True, "max_tokens": WORDS}


def test_a_client_that_stops_reading_is_cancelled(start: Any) -> None:
    """A streamed reply of 200,000 words to a client that reads nothing: once its
    receive buffer is full, the send queue stops draining, and after send_timeout the
    generation stops; bounded by what that takes at this machine's present speed
    (tests/api/stopped.py)."""
    env = {"WARMSTART_SEND_TIMEOUT": "2"}
    fake = (*BIG_CTX, "--reply-words", str(WORDS), "--token-delay", "0.0005")
    path = "/v1/chat/completions"
    with start(env=env, fake_args=fake) as srv:
        port = int(srv.base_url.rsplit(":", 1)[1])
        t0 = time.monotonic()
        with contextlib.closing(stream_raw(port, path, TALK)) as sock:
            while not _active(srv) and time.monotonic() - t0 < 60:
                time.sleep(0.05)
            while _active(srv) and time.monotonic() - t0 < 300:  # a hang guard, not the bound
                time.sleep(0.1)
            cancelled_after = time.monotonic() - t0
            held = unread(sock)
        stats = httpx.get(srv.v1 + "/warmstart/stats").json()
        assert stats["queue"]["active"] == 0, f"still generating after {cancelled_after:.0f} s"
        assert 0 < stats["completion_tokens"] < WORDS // 2
        fill = seconds_to_receive(port, path, TALK, held)
        assert cancelled_after < cancel_bound(fill, 2.0), (cancelled_after, fill, held)
