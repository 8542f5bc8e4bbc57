"""Bad input gets an OpenAI-shaped 4xx, and the server keeps serving."""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.api.conftest import Server
from tests.timing import timed

USER = [{"role": "user", "content": "hello"}]


def _post(server: Server, path: str, body: Any, **kw: Any) -> httpx.Response:
    content = body if isinstance(body, bytes | str) else json.dumps(body)
    headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
    return httpx.post(server.v1 + path, content=content, headers=headers, timeout=30, **kw)


def _assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code
    return error


BAD_CHAT = {
    "malformed JSON": (b'{"messages": [', "messages"),
    "not an object": ([1, 2], None),
    "messages missing": ({"model": "default"}, "messages"),
    "messages wrong type": ({"messages": "hello"}, "messages"),
    "empty messages": ({"messages": []}, "messages"),
    "unknown role": ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    "content wrong type": ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    "image part": (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages",
    ),
    "temperature as text": ({"messages": USER, "temperature": "hot"}, "temperature"),
    "temperature too high": ({"messages": USER, "temperature": 7}, "temperature"),
    "top_p negative": ({"messages": USER, "top_p": -1}, "top_p"),
    "max_tokens zero": ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    "max_tokens past the context": ({"messages": USER, "max_tokens": 10**6}, "max_tokens"),
    "max_tokens float": ({"messages": USER, "max_tokens": 1.5}, "max_tokens"),
    "n above one": ({"messages": USER, "n": 2}, "n"),
    "too many stops": ({"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    "stream as text": ({"messages": USER, "stream": "yes"}, "stream"),
}


@pytest.mark.parametrize("body,param", BAD_CHAT.values(), ids=BAD_CHAT.keys())
def test_bad_chat_request_is_400(server: Server, body: Any, param: str | None) -> None:
    error = _assert_openai_error(_post(server, "/chat/completions", body), 400)
    assert error["type"] == "invalid_request_error"
    if param is not None and body != b'{"messages": [':
        assert (error["param"] or "").startswith(param)


def test_unknown_model_is_404(server: Server) -> None:
    body = {"model": "gpt-17", "messages": USER}
    error = _assert_openai_error(_post(server, "/chat/completions", body), 404, "model_not_found")
    assert "gpt-17" in error["message"]
    response = httpx.get(server.v1 + "/models/gpt-17")
    _assert_openai_error(response, 404, "model_not_found")


def test_prompt_longer_than_context_is_400(server: Server) -> None:
    long = [{"role": "user", "content": "word " * 100_000}]
    response = _post(server, "/chat/completions", {"messages": long})
    _assert_openai_error(response, 400, "context_length_exceeded")
    response = _post(server, "/completions", {"prompt": "word " * 100_000})
    _assert_openai_error(response, 400, "context_length_exceeded")


def test_bad_completion_requests(server: Server) -> None:
    for body in ({"prompt": ""}, {"prompt": 3}, {"prompt": ["a", "b"]}, {}):
        _assert_openai_error(_post(server, "/completions", body), 400)


def test_body_over_the_limit_is_413(server: Server) -> None:
    """Every time: a client still uploading when the 413 is decided must read it (a
    close with unread bytes resets the connection and can destroy the answer)."""
    huge = json.dumps({"messages": [{"role": "user", "content": "x" * (5 << 20)}]})
    for _ in range(10):
        _assert_openai_error(_post(server, "/chat/completions", huge), 413, "request_too_large")


def test_unknown_route_and_method(server: Server) -> None:
    _assert_openai_error(httpx.get(server.v1 + "/nothing-here"), 404)
    _assert_openai_error(httpx.get(server.v1 + "/chat/completions"), 405)


def test_unknown_session_is_404(server: Server) -> None:
    base = server.v1 + "/warmstart/sessions/no-such-session"
    _assert_openai_error(httpx.get(base), 404, "session_not_found")
    _assert_openai_error(httpx.delete(base), 404, "session_not_found")
    _assert_openai_error(httpx.post(base + "/prewarm"), 404, "session_not_found")


def test_server_keeps_serving_after_errors(server: Server) -> None:
    for body in BAD_CHAT.values():
        _post(server, "/chat/completions", body[0])
    response = _post(server, "/chat/completions", {"messages": USER, "max_tokens": 4})
    assert response.status_code == 200
    assert httpx.get(server.base_url + "/health").json()["status"] == "ok"


def test_busy_is_429_with_retry_after(start: Any, is_fake: bool) -> None:
    if not is_fake:
        pytest.skip("needs the fake's token delay to hold the queue full")
    slow = ("--slots", "1", "--token-delay", "0.05")
    with start("--max-queue", "1", fake_args=slow) as srv:
        body = {"messages": USER, "max_tokens": 20, "temperature": 0}
        with ThreadPoolExecutor(max_workers=6) as pool:
            responses = list(pool.map(lambda _: _post(srv, "/chat/completions", body), range(6)))
        statuses = sorted(r.status_code for r in responses)
        assert 200 in statuses and 429 in statuses, statuses
        busy = next(r for r in responses if r.status_code == 429)
        _assert_openai_error(busy, 429, "rate_limit_exceeded")
        assert int(busy.headers["Retry-After"]) >= 1


def test_disconnect_cancels_generation_and_frees_the_slot(start: Any, is_fake: bool) -> None:
    if not is_fake:
        pytest.skip("needs the fake's token delay to make a reply long enough to abandon")
    # At 0.5 s per token a whole reply of 40 words or more takes 20 s or more; the
    # slot is free again within twice a reply of two tokens (one token's delay, timed
    # just before on this machine at its present load), as a stopped reply's is.
    fake = ("--slots", "1", "--token-delay", "0.5", "--reply-words", "40")
    with start(fake_args=fake) as srv:
        two = {"messages": USER, "max_tokens": 2}
        baseline, reply = timed(lambda: _post(srv, "/chat/completions", two))
        assert reply.status_code == 200, reply.text
        body = {"messages": [{"role": "user", "content": str(uuid.uuid4())}], "stream": True}
        with httpx.stream("POST", srv.v1 + "/chat/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            while "content" not in next(lines):  # a token arrived: generation is under way
                pass
        left = time.monotonic()
        while time.monotonic() - left < 60:  # a hang guard, not the bound
            stats = httpx.get(srv.v1 + "/warmstart/stats", timeout=30).json()
            if stats["queue"]["active"] == 0:
                break
            time.sleep(0.05)
        freed = time.monotonic() - left
        assert freed < 2 * baseline, (freed, baseline, stats)
        assert stats["queue"] == {"waiting": 0, "active": 0, "max_queue": 16}
        assert stats["completion_tokens"] < 40  # cancelled, not run to its end
        # The one slot is free again: a new request is served at once.
        done = _post(srv, "/chat/completions", {"messages": USER, "max_tokens": 2})
        assert done.status_code == 200
        assert "finish_reason" in done.text
