"""warmstart's own endpoints on a real server: sessions, prewarm, stats, settings,
/health and /metrics."""

from __future__ import annotations

import uuid

import httpx

from tests.api.conftest import Server


def _talk(server: Server, session: str) -> dict:
    body = {"messages": [{"role": "user", "content": f"hi {session}"}], "max_tokens": 8}
    headers = {"X-Warmstart-Session": session}
    response = httpx.post(server.v1 + "/chat/completions", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_session_lifecycle(server: Server) -> None:
    session = f"chat-{uuid.uuid4()}"
    _talk(server, session)
    sessions = httpx.get(server.v1 + "/warmstart/sessions").json()
    assert sessions["object"] == "list"
    listed = {s["id"]: s for s in sessions["data"]}
    assert listed[session]["cached_tokens"] > 0
    assert set(listed[session]["tiers"]) == {"live", "ram", "disk"}
    assert listed[session]["location"] in ("live", "ram", "disk")

    one = httpx.get(f"{server.v1}/warmstart/sessions/{session}").json()
    assert [m["role"] for m in one["messages"]][-1] == "assistant"

    warmed = httpx.post(f"{server.v1}/warmstart/sessions/{session}/prewarm").json()
    assert warmed["session_id"] == session and warmed["promoted_tokens"] >= 0

    deleted = httpx.delete(f"{server.v1}/warmstart/sessions/{session}")
    assert deleted.json() == {"id": session, "object": "warmstart.session.deleted", "deleted": True}
    assert httpx.get(f"{server.v1}/warmstart/sessions/{session}").status_code == 404


def test_rename_keeps_the_title_across_turns(server: Server) -> None:
    session = f"rename-{uuid.uuid4()}"
    _talk(server, session)
    url = f"{server.v1}/warmstart/sessions/{session}"
    renamed = httpx.patch(url, json={"title": "My own title"})
    assert renamed.status_code == 200, renamed.text
    assert renamed.json()["title"] == "My own title"
    _talk(server, session)
    assert httpx.get(url).json()["title"] == "My own title"
    assert httpx.patch(url, json={"title": ""}).status_code == 400
    missing = httpx.patch(
        f"{server.v1}/warmstart/sessions/nobody-{uuid.uuid4()}", json={"title": "x"}
    )
    assert missing.status_code == 404


def test_import_adds_conversations_once(server: Server) -> None:
    kept = {
        "id": f"old-{uuid.uuid4()}",
        "title": "From the old app",
        "created": 1_700_000_000.0,
        "updated": 1_700_000_100.0,
        "messages": [
            {"role": "user", "content": "What is a KV cache?"},
            {"role": "assistant", "content": "Keys and values.", "interrupted": True},
        ],
    }
    url = f"{server.v1}/warmstart/sessions/import"
    first = httpx.post(url, json={"sessions": [kept]})
    assert first.status_code == 200, first.text
    assert first.json()["imported"] == [kept["id"]] and first.json()["existing"] == []
    again = httpx.post(url, json={"sessions": [{**kept, "title": "changed"}]}).json()
    assert again["imported"] == [] and again["existing"] == [kept["id"]]
    one = httpx.get(f"{server.v1}/warmstart/sessions/{kept['id']}").json()
    assert one["title"] == "From the old app" and one["updated"] == kept["updated"]
    assert one["messages"] == kept["messages"]
    listed = httpx.get(server.v1 + "/warmstart/sessions").json()["data"]
    assert kept["id"] in {s["id"] for s in listed}
    found = httpx.get(server.v1 + "/warmstart/sessions", params={"q": "keys AND"}).json()
    assert [s["id"] for s in found["data"]] == [kept["id"]]
    bad = {**kept, "messages": [{"role": "tool", "content": "x"}]}
    assert httpx.post(url, json={"sessions": [bad]}).status_code == 400


def test_stats_and_settings(server: Server) -> None:
    _talk(server, f"stats-{uuid.uuid4()}")
    stats = httpx.get(server.v1 + "/warmstart/stats").json()
    assert stats["requests"] >= 1
    settings = httpx.get(server.v1 + "/warmstart/settings").json()
    assert settings and all({"value", "reason"} <= set(v) for v in settings.values())


def test_health(server: Server) -> None:
    health = httpx.get(server.base_url + "/health").json()
    assert health["status"] == "ok"
    assert health["model"] == httpx.get(server.v1 + "/models").json()["data"][0]["id"]


def test_metrics_exposition(server: Server) -> None:
    reply = _talk(server, f"metrics-{uuid.uuid4()}")
    assert reply["usage"]["prompt_tokens"] > 0
    text = httpx.get(server.base_url + "/metrics").text
    for name in (
        "warmstart_http_requests_total",
        "warmstart_prompt_tokens_total",
        "warmstart_completion_tokens_total",
        "warmstart_ttft_seconds_bucket",
        "warmstart_restore_seconds_bucket",
        'warmstart_cache_hits_total{tier="ram"}',
        'warmstart_restored_tokens_total{tier="disk"}',
        'warmstart_tier_bytes{tier="ram"}',
        "warmstart_evictions_total",
    ):
        assert name in text, name
    assert 'route="/v1/chat/completions",status="200"' in text
