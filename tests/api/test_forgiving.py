"""A server that forgives headers as Ollama does: a JSON body is JSON whatever its
Content-Type (``curl -d`` sends application/x-www-form-urlencoded), ``GET /`` answers a
short status, and requests that name no session stay out of the conversation list.
The guards still hold: body size, API key, Host and Origin."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from typing import Any

import httpx
import pytest

from tests.api.conftest import Server

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def _chat_body(text: str, **extra: Any) -> bytes:
    body = {"model": "default", "messages": [{"role": "user", "content": text}], **extra}
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    "content_type",
    ["application/x-www-form-urlencoded", "text/plain", "text/plain; charset=utf-8", None],
)
def test_a_json_body_is_read_whatever_its_content_type(
    server: Server, content_type: str | None
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    ollama = httpx.post(
        server.base_url + "/api/chat",
        content=_chat_body(f"hello {uuid.uuid4()}", stream=False),
        headers=headers,
        timeout=60,
    )
    assert ollama.status_code == 200, ollama.text
    assert ollama.json()["message"]["content"]
    openai = httpx.post(
        server.v1 + "/chat/completions",
        content=_chat_body(f"hello {uuid.uuid4()}", max_tokens=4),
        headers=headers,
        timeout=60,
    )
    assert openai.status_code == 200, openai.text
    assert openai.json()["choices"][0]["message"]["content"]


def test_curl_without_a_content_type_answers(server: Server) -> None:
    """The issue's acceptance: Ollama's own curl example, as typed."""
    if shutil.which("curl") is None:
        pytest.skip("no curl here")
    body = _chat_body(f"why is the sky blue {uuid.uuid4()}", stream=False).decode()
    proc = subprocess.run(
        ["curl", "-sS", "-d", body, server.base_url + "/api/chat"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["done"] is True


def test_what_is_not_json_still_gets_a_clear_error(server: Server) -> None:
    reply = httpx.post(server.v1 + "/chat/completions", content=b"a=1&b=2", headers=FORM)
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error"
    broken = httpx.post(server.v1 + "/chat/completions", content=b"{not json", headers=FORM)
    assert broken.status_code == 400, broken.text
    ollama = httpx.post(server.base_url + "/api/chat", content=b"{not json", headers=FORM)
    assert ollama.status_code == 400 and "error" in ollama.json()


def test_the_body_limit_holds_for_any_content_type(start: Any) -> None:
    with start(env={"WARMSTART_MAX_REQUEST_BYTES": "2048"}) as srv:
        big = _chat_body("x" * 4096, stream=False)
        reply = httpx.post(srv.base_url + "/api/chat", content=big, headers=FORM, timeout=30)
        assert reply.status_code == 413, reply.text


def test_root_says_it_is_running_without_a_key_behind_the_host_guard(start: Any) -> None:
    key = "k" * 24
    with start("--api-key", key) as srv:
        root = httpx.get(srv.base_url + "/")
        assert root.status_code == 200 and root.text == "warmstart is running"
        assert root.headers["content-type"].startswith("text/plain")
        assert httpx.head(srv.base_url + "/").status_code == 200
        assert httpx.get(srv.v1 + "/models").status_code == 401  # the rest still asks
        rebound = httpx.get(srv.base_url + "/", headers={"Host": "evil.example"})
        assert rebound.status_code == 403


def test_a_cross_site_post_is_refused_even_when_it_is_json(server: Server) -> None:
    """A page may POST text/plain without a preflight; the Origin check refuses it
    before the body is read, so reading it as JSON opens nothing."""
    reply = httpx.post(
        server.base_url + "/api/chat",
        content=_chat_body("hi", stream=False),
        headers={"Content-Type": "text/plain", "Origin": "https://evil.example"},
    )
    assert reply.status_code == 403


def test_requests_without_a_session_stay_out_of_the_list(server: Server) -> None:
    marker = uuid.uuid4().hex
    plain = httpx.post(
        server.v1 + "/chat/completions",
        json={"model": "default", "messages": [{"role": "user", "content": f"hi {marker}"}]},
        timeout=60,
    )
    assert plain.status_code == 200
    named = f"mine-{marker}"
    reply = httpx.post(
        server.v1 + "/chat/completions",
        json={"model": "default", "messages": [{"role": "user", "content": f"yo {marker}"}]},
        headers={"X-Warmstart-Session": named},
        timeout=60,
    )
    assert reply.status_code == 200
    listed = httpx.get(server.v1 + "/warmstart/sessions", params={"q": marker}).json()["data"]
    assert [s["id"] for s in listed] == [named] and listed[0]["anonymous"] is False
    every = httpx.get(server.v1 + "/warmstart/sessions", params={"q": marker, "all": 1})
    found = every.json()["data"]
    assert len(found) == 2 and [s["anonymous"] for s in found].count(True) == 1


def test_the_apps_list_is_the_users_chats(server: Server) -> None:
    """The desktop app lists what /v1/warmstart/sessions lists: its own chats (it always
    names them), not the requests of other clients that named none."""
    from warmstart.app.core.api import ApiClient

    marker = uuid.uuid4().hex
    body = {"model": "default", "messages": [{"role": "user", "content": f"Hi {marker}"}]}
    assert httpx.post(server.v1 + "/chat/completions", json=body, timeout=60).status_code == 200
    named = {**body, "user": f"app-{marker}"}  # the app sends its id as `user` and a header
    assert httpx.post(server.v1 + "/chat/completions", json=named, timeout=60).status_code == 200
    api = ApiClient(server.v1)
    try:
        listed = api.sessions(marker)
    finally:
        api.close()
    assert listed is not None and [s.id for s in listed] == [f"app-{marker}"]
