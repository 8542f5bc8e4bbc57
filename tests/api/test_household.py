"""A household server (fake engine): each user's conversations, responses and KV cache
are theirs. Another user's id is a 404, as an unknown one; a prompt one user sent
never restores for another; cache_salt narrows within a user; keys take effect
without a restart and are never written in clear."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from warmstart.runtime.users import add_user, remove_user

from tests.api.conftest import Server

LOCAL_KEY = "local-key-0123456789"


@pytest.fixture
def household(start: Any, tmp_path: Path) -> Iterator[tuple[Server, dict[str, str], Path]]:
    data = tmp_path / "data"
    keys = {name: add_user(data / "keys.json", name) for name in ("alice", "bob")}
    keys["local"] = LOCAL_KEY
    with start("--api-key", LOCAL_KEY, "--data-dir", str(data), log_dir=tmp_path) as srv:
        yield srv, keys, data


class _As:
    def __init__(self, srv: Server, key: str) -> None:
        self.srv = srv
        self.headers = {"Authorization": f"Bearer {key}"}

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return httpx.request(method, self.srv.v1 + path, headers=self.headers, timeout=60, **kw)

    def chat(self, text: str, session: str | None = None, **extra: Any) -> dict[str, Any]:
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4, **extra}
        head = {"X-Warmstart-Session": session} if session else {}
        reply = httpx.post(
            self.srv.v1 + "/chat/completions",
            json=body,
            headers={**self.headers, **head},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        return reply.json()


def _cached(reply: dict[str, Any]) -> int:
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_another_users_conversations_are_not_found(household: Any) -> None:
    srv, keys, _ = household
    alice, bob = _As(srv, keys["alice"]), _As(srv, keys["bob"])
    title = f"Alice's secret plan {uuid.uuid4().hex[:8]}"
    alice.chat(title, session="plans")
    mine = alice.call("GET", "/warmstart/sessions").json()["data"]
    assert [s["title"] for s in mine] == [title]
    for who in (bob, _As(srv, keys["local"])):
        for everything in ("0", "1"):
            listed = who.call("GET", f"/warmstart/sessions?all={everything}&q=secret")
            assert listed.status_code == 200 and title not in listed.text
        for method, path, body in (
            ("GET", "/warmstart/sessions/plans", None),
            ("PATCH", "/warmstart/sessions/plans", {"title": "mine now"}),
            ("POST", "/warmstart/sessions/plans/prewarm", None),
            ("DELETE", "/warmstart/sessions/plans", None),
        ):
            answer = who.call(method, path, json=body)
            assert answer.status_code == 404, (method, path, answer.text)
            assert title not in answer.text
    # bob's own conversation of the same name is his, and leaves alice's as it was
    bob.chat("bob's own words", session="plans")
    assert "Alice" not in bob.call("GET", "/warmstart/sessions/plans").text
    assert alice.call("GET", "/warmstart/sessions/plans").json()["title"] == title
    for route in ("/warmstart/stats",):
        assert title not in alice.call("GET", route).text
    metrics = httpx.get(srv.base_url + "/metrics", headers=bob.headers).text
    assert title not in metrics and "plans" not in metrics


def test_another_users_responses_are_not_found(household: Any) -> None:
    srv, keys, _ = household
    alice, bob = _As(srv, keys["alice"]), _As(srv, keys["bob"])
    made = alice.call("POST", "/responses", json={"input": "remember 42", "max_output_tokens": 4})
    assert made.status_code == 200, made.text
    rid = made.json()["id"]
    assert alice.call("GET", f"/responses/{rid}").status_code == 200
    assert bob.call("GET", f"/responses/{rid}").status_code == 404
    assert bob.call("DELETE", f"/responses/{rid}").status_code == 404
    chained = bob.call("POST", "/responses", json={"input": "and?", "previous_response_id": rid})
    assert chained.status_code in (400, 404) and "remember" not in chained.text
    assert chained.json()["error"]["code"] == "previous_response_not_found"
    assert alice.call("GET", f"/responses/{rid}").status_code == 200  # still there


def test_a_prompt_restores_for_its_own_user_only(household: Any) -> None:
    srv, keys, _ = household
    alice, bob, local = (_As(srv, keys[n]) for n in ("alice", "bob", "local"))
    prompt = "A long shared document. " * 60
    assert _cached(alice.chat(prompt)) == 0
    assert _cached(bob.chat(prompt)) == 0  # the same prompt: not alice's cache
    assert _cached(local.chat(prompt)) == 0
    assert _cached(alice.chat(prompt)) > 0
    assert _cached(bob.chat(prompt)) > 0  # his own, now


def test_cache_salt_narrows_within_a_user(household: Any) -> None:
    srv, keys, _ = household
    alice = _As(srv, keys["alice"])
    prompt = "Salted prompt words. " * 60
    assert _cached(alice.chat(prompt, cache_salt="one")) == 0
    assert _cached(alice.chat(prompt, cache_salt="two")) == 0
    assert _cached(alice.chat(prompt)) == 0
    assert _cached(alice.chat(prompt, cache_salt="one")) > 0


def test_keys_change_without_a_restart_and_are_never_in_clear(
    household: Any, tmp_path: Path
) -> None:
    srv, keys, data = household
    carol_key = add_user(data / "keys.json", "carol")
    carol = _As(srv, carol_key)
    carol.chat("hello from carol")
    assert remove_user(data / "keys.json", "bob")
    gone = _As(srv, keys["bob"]).call("GET", "/warmstart/sessions")
    assert gone.status_code == 401
    secrets = [carol_key, *keys.values()]
    for path in [*data.rglob("*"), *tmp_path.glob("*.log")]:
        if path.is_file():
            raw = path.read_bytes()
            assert not any(s.encode() in raw for s in secrets), path


def test_a_wrong_key_is_refused_once_users_exist(household: Any) -> None:
    srv, _, _ = household
    for headers in ({}, {"Authorization": "Bearer wsk-not-a-key"}):
        answer = httpx.get(srv.v1 + "/warmstart/sessions", headers=headers)
        assert answer.status_code == 401


def test_users_are_served_in_turn(start: Any, tmp_path: Path) -> None:
    """While alice floods 20 requests, bob's one is answered before her queue drains:
    asserted by the order the replies end in, not by seconds. Past her share of the
    queue she gets 429 with Retry-After; bob, with nothing waiting, is still let in."""
    data = tmp_path / "data"
    keys = {name: add_user(data / "keys.json", name) for name in ("alice", "bob")}
    args = ("--data-dir", str(data), "--max-queue", "8")
    with start(*args, fake_args=("--token-delay", "0.05", "--slots", "2")) as srv:
        alice, bob = _As(srv, keys["alice"]), _As(srv, keys["bob"])
        order: list[str] = []
        statuses: list[int] = []
        lock = threading.Lock()

        def ask(who: _As, name: str, i: int) -> None:
            body = {"messages": [{"role": "user", "content": f"{name} {i}"}], "max_tokens": 8}
            answer = who.call("POST", "/chat/completions", json=body)
            with lock:
                statuses.append(answer.status_code)
                if answer.status_code == 200:
                    order.append(name)
                else:
                    assert answer.status_code == 429 and answer.headers["Retry-After"]

        flood = [threading.Thread(target=ask, args=(alice, "alice", i)) for i in range(20)]
        for thread in flood:
            thread.start()
        deadline = time.monotonic() + 60
        while _waiting(alice) < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        ask(bob, "bob", 0)
        for thread in flood:
            thread.join()
    assert "bob" in order and 429 in statuses  # her flood met her limit, not his
    after = len(order) - 1 - order.index("bob")
    # in arrival order bob would wait behind all of her queued requests (6 or more)
    assert after >= 4, order


def _waiting(who: _As) -> int:
    return int(who.call("GET", "/warmstart/stats").json()["queue"]["waiting"])
