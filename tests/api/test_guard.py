"""DNS rebinding and cross-site requests: the Host allow-list and the Origin check,
against a real server process on loopback."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from warmstart.runtime.api._guard import HostPolicy, same_origin, split_host

EVIL = "evil.example.com"


def _chat(srv: Any, session: str, **headers: str) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(
        srv.v1 + "/chat/completions",
        json=body,
        headers={"X-Warmstart-Session": session, **headers},
        timeout=30,
    )


def _refused(response: httpx.Response, code: str) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert error["type"] == "permission_error"


def test_a_rebound_host_is_refused_everywhere(server: Any) -> None:
    assert _chat(server, "guarded").status_code == 200  # a session to attack
    sessions = server.v1 + "/warmstart/sessions"
    host = {"Host": f"{EVIL}:{server.base_url.rsplit(':', 1)[1]}"}
    _refused(httpx.get(sessions, headers=host), "host_not_allowed")
    _refused(httpx.get(sessions + "/guarded", headers=host), "host_not_allowed")
    _refused(_chat(server, "other", **host), "host_not_allowed")
    _refused(httpx.delete(sessions + "/guarded", headers=host), "host_not_allowed")
    _refused(httpx.get(sessions, headers={"Host": EVIL}), "host_not_allowed")
    assert httpx.get(sessions + "/guarded").status_code == 200  # still there
    for good in ("localhost", "localhost:1", "app.localhost", "127.0.0.1", "[::1]:8765"):
        assert httpx.get(sessions, headers={"Host": good}).status_code == 200, good


def test_a_cross_origin_post_without_a_body_is_refused(server: Any) -> None:
    assert _chat(server, "prewarmed").status_code == 200
    url = server.v1 + "/warmstart/sessions/prewarmed/prewarm"
    _refused(httpx.post(url, headers={"Origin": "https://" + EVIL}), "origin_not_allowed")
    _refused(httpx.post(url, headers={"Origin": "null"}), "origin_not_allowed")
    delete = server.v1 + "/warmstart/sessions/prewarmed"
    _refused(httpx.delete(delete, headers={"Origin": "http://" + EVIL}), "origin_not_allowed")
    _refused(_chat(server, "x", Origin="http://localhost:9"), "origin_not_allowed")
    # a page served by this very server (the /docs page) and a tool without Origin pass
    assert httpx.post(url, headers={"Origin": server.base_url}).status_code == 200
    assert httpx.post(url).status_code == 200
    # reading is left to the browser's same-origin policy (no CORS headers are sent)
    got = httpx.get(server.v1 + "/models", headers={"Origin": "http://" + EVIL})
    assert got.status_code == 200
    assert "access-control-allow-origin" not in got.headers


def test_configured_origins_and_hosts_are_allowed(start: Any) -> None:
    env = {
        "WARMSTART_CORS_ORIGINS": '["http://ui.example.com"]',
        "WARMSTART_ALLOWED_HOSTS": '["box.example.com", "*.lan"]',
    }
    with start(env=env) as srv:
        ok = _chat(srv, "cors", Origin="http://ui.example.com")
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "http://ui.example.com"
        _refused(_chat(srv, "cors", Origin="http://other.example.com"), "origin_not_allowed")
        models = srv.v1 + "/models"
        for host in ("box.example.com", "pc.lan", "a.b.lan:80"):
            assert httpx.get(models, headers={"Host": host}).status_code == 200, host
        _refused(httpx.get(models, headers={"Host": "lan"}), "host_not_allowed")
        _refused(httpx.get(models, headers={"Host": EVIL}), "host_not_allowed")


@pytest.mark.parametrize(
    ("header", "host"),
    [
        ("127.0.0.1:8765", "127.0.0.1"),
        ("[::1]:8765", "::1"),
        ("LocalHost.", "localhost"),
        ("Example.com:80", "example.com"),
        ("", ""),
    ],
)
def test_split_host(header: str, host: str) -> None:
    assert split_host(header) == host


def test_host_policy_off_loopback() -> None:
    loopback = HostPolicy("127.0.0.1", machine_name="pc")
    assert not loopback.allows("pc") and not loopback.allows("192.168.1.4")
    assert loopback.allows("127.0.0.2") and loopback.allows("::1")
    lan = HostPolicy("192.168.1.4", machine_name="pc.home")
    assert lan.allows("192.168.1.4") and lan.allows("pc") and lan.allows("pc.local")
    assert not lan.allows("192.168.1.5") and not lan.allows(EVIL)
    wildcard = HostPolicy("0.0.0.0", ["nas.example.org"], machine_name="pc")
    assert wildcard.allows("10.0.0.7") and wildcard.allows("nas.example.org")
    assert not wildcard.allows(EVIL)
    assert HostPolicy("127.0.0.1", ["*"]).allows(EVIL)


def test_same_origin() -> None:
    assert same_origin("http://127.0.0.1:8765", "127.0.0.1:8765")
    assert not same_origin("http://127.0.0.1:8766", "127.0.0.1:8765")
    assert not same_origin("null", "127.0.0.1:8765")
    assert not same_origin("file://", "")
