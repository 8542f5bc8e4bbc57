"""Session ids are safe names wherever a client gives one (a real server process on
the fake runtime): the header, ``user``, ``prompt_cache_key``, import and the
session routes refuse a '/', '..', a control character or an over-long id with a
400 that says why; ordinary ids work as before."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from warmstart.runtime.serving._sessions import MAX_SESSION_ID

BAD = {
    "slash": "a/b",
    "traversal": "../../etc/passwd",
    "absolute": "/etc/passwd",
    "backslash": "..\\x",
    "dots": "x..y",
    "newline": "a\nb",
    "escape": "a\x1b[2Jb",
    "nul": "a\x00b",
    "too-long": "x" * (MAX_SESSION_ID + 1),
}
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


def _refused(reply: httpx.Response, param: str | None = None) -> None:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    said = error if isinstance(error, str) else error["message"]  # Ollama: the message
    assert "session id is a name of" in said, said
    if isinstance(error, str):
        return
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize("bad", BAD.values(), ids=BAD.keys())
def test_a_bad_id_is_refused_in_the_body(server: Any, bad: str) -> None:
    for field in ("user", "prompt_cache_key"):
        reply = httpx.post(server.v1 + "/chat/completions", json={**CHAT, field: bad}, timeout=30)
        _refused(reply, field)
    reply = httpx.post(server.v1 + "/completions", json={"prompt": "x", "user": bad}, timeout=30)
    _refused(reply, "user")
    ollama = {"model": "default", "messages": CHAT["messages"], "stream": False, "user": bad}
    _refused(httpx.post(server.base_url + "/api/chat", json=ollama, timeout=30), "user")
    imported = {"sessions": [{"id": bad, "created": 1.0, "updated": 1.0, "messages": []}]}
    reply = httpx.post(server.v1 + "/warmstart/sessions/import", json=imported, timeout=30)
    _refused(reply)
    listed = httpx.get(server.v1 + "/warmstart/sessions", timeout=30).json()["data"]
    assert bad not in {s["id"] for s in listed}


@pytest.mark.parametrize("bad", ["a/b", "../../etc/passwd", "x..y", "a\tb"])
def test_a_bad_id_is_refused_in_the_header(server: Any, bad: str) -> None:
    headers = {"X-Warmstart-Session": bad}
    reply = httpx.post(server.v1 + "/chat/completions", json=CHAT, headers=headers, timeout=30)
    _refused(reply)


def test_an_unknown_bad_id_in_a_route_says_why_not_just_404(server: Any) -> None:
    routes = server.v1 + "/warmstart/sessions/"
    for method, path, body in [
        ("GET", "..%2Fx%2Fy", None),
        ("DELETE", "%2Fetc%2Fpasswd", None),
        ("PATCH", "a%2Fb", {"title": "renamed"}),
        ("POST", "..%2Fx/prewarm", None),
    ]:
        reply = httpx.request(method, routes + path, json=body, timeout=30)
        assert reply.status_code == 400, (method, path, reply.text)
        assert reply.json()["error"]["code"] == "invalid_session_id"
    assert httpx.get(routes + "never-seen", timeout=30).status_code == 404


@pytest.mark.parametrize("good", ["alice@example.com", "s-1_2.3", "café ☕", "x" * MAX_SESSION_ID])
def test_ordinary_ids_work_everywhere(server: Any, good: str) -> None:
    reply = httpx.post(server.v1 + "/chat/completions", json={**CHAT, "user": good}, timeout=30)
    assert reply.status_code == 200, reply.text
    from warmstart.app.core.api import session_path

    url = server.v1 + "/warmstart/" + session_path(good)
    assert httpx.get(url, timeout=30).json()["id"] == good
    assert httpx.patch(url, json={"title": "t"}, timeout=30).status_code == 200
    assert httpx.post(url + "/prewarm", timeout=30).status_code == 200
    assert httpx.delete(url, timeout=30).status_code == 200
    assert httpx.get(url, timeout=30).status_code == 404
