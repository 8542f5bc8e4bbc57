"""Work is bounded before it starts, and a client that leaves or stops reading stops
costing the server (real server processes on loopback)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest

BIG_CTX = ("--n-ctx", "4000000")


def _active(srv: Any) -> int:
    return int(httpx.get(srv.v1 + "/warmstart/stats", timeout=10).json()["queue"]["active"])


def _free_within(srv: Any, seconds: float) -> float:
    """Seconds until no generation is active and a small chat is answered."""
    t0 = time.monotonic()
    while _active(srv) and time.monotonic() - t0 < seconds:
        time.sleep(0.05)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(srv.v1 + "/chat/completions", json=body, timeout=30).status_code == 200
    return time.monotonic() - t0


def test_fifty_thousand_messages_are_refused_fast(server: Any) -> None:
    messages = [{"role": "user", "content": "hi"}] * 50_000
    t0 = time.monotonic()
    response = httpx.post(server.v1 + "/chat/completions", json={"messages": messages}, timeout=60)
    elapsed = time.monotonic() - t0
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "too_many_messages"
    assert response.json()["error"]["param"] == "messages"
    assert elapsed < 5.0, elapsed


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
    """1 MB of prompt takes the fake ~40 s to prefill; its client gives up after 3 s."""
    with start(fake_args=BIG_CTX) as srv:
        words = "word " * 200_000
        body = {"messages": [{"role": "user", "content": words}], "stream": stream}
        body["max_tokens"] = 4
        assert len(json.dumps(body)) > 1_000_000
        url = srv.v1 + "/chat/completions"
        with pytest.raises(httpx.ReadTimeout), httpx.stream("POST", url, json=body, timeout=3) as r:
            for _ in r.iter_bytes():
                pass
        assert _free_within(srv, 10) < 2.0


def test_a_client_that_stops_reading_is_cancelled(start: Any) -> None:
    """A streamed reply of 200,000 words to a client that reads nothing: once the
    socket buffers fill, the send waits, and after send_timeout the generation stops."""
    env = {"WARMSTART_SEND_TIMEOUT": "2"}
    fake = (*BIG_CTX, "--reply-words", "200000", "--token-delay", "0.0005")
    with start(env=env, fake_args=fake) as srv:
        port = int(srv.base_url.rsplit(":", 1)[1])
        body = json.dumps(
            {
                "messages": [{"role": "user", "content": "talk"}],
                "stream": True,
                "max_tokens": 200000,
            }
        ).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        t0 = time.monotonic()
        try:
            sock.sendall(head.encode() + body)
            while not _active(srv) and time.monotonic() - t0 < 10:
                time.sleep(0.05)
            while _active(srv) and time.monotonic() - t0 < 60:
                time.sleep(0.1)
            cancelled_after = time.monotonic() - t0
            stats = httpx.get(srv.v1 + "/warmstart/stats").json()
        finally:
            sock.close()
        # buffers fill in well under a second at this rate; then send_timeout (2 s)
        assert cancelled_after < 5.0, cancelled_after
        assert 0 < stats["completion_tokens"] < 100_000
