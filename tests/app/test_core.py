"""app.core without Qt: store migrations, SSE, the HTTP client, the report sentences."""

from __future__ import annotations

import json
import sqlite3

import httpx
import pytest
import warmstart.app.core as app_core
from warmstart.app.core import (
    ApiClient,
    ContextFull,
    ConversationStore,
    Finished,
    ModelMissing,
    RateLimited,
    ReplyReport,
    Sampling,
    ServerUnavailable,
    StoreError,
    TextDelta,
    describe,
    format_status,
    parse_stats,
)
from warmstart.app.core.migrations import MIGRATIONS, applied, migrate
from warmstart.app.core.preferences import Preferences
from warmstart.app.core.sse import DONE, iter_sse_json


def test_public_names_are_all_exported():
    public = {n for n in dir(app_core) if not n.startswith("_")}
    modules = {"api", "errors", "history", "launcher", "memory", "migrations", "models", "paths"}
    modules |= {"preferences"}
    modules |= {"private", "report", "secret_store", "sse", "store", "types"}
    assert public - modules == set(app_core.__all__)


# -- store ---------------------------------------------------------------------------


def test_blank_database_migrates_to_the_latest_schema(tmp_path):
    conn = sqlite3.connect(tmp_path / "blank.db", isolation_level=None)
    assert migrate(conn) == [name for name, _ in MIGRATIONS]
    assert applied(conn) == sorted(name for name, _ in MIGRATIONS)
    assert migrate(conn) == []  # idempotent
    columns = {row[1] for row in conn.execute("PRAGMA table_info(conversations)")}
    assert {"id", "title", "pinned", "model", "updated"} <= columns


def test_migration_names_are_ordered_and_unique():
    names = [name for name, _ in MIGRATIONS]
    assert names == sorted(names) and len(set(names)) == len(names)


def test_a_newer_database_is_refused(tmp_path):
    conn = sqlite3.connect(tmp_path / "new.db", isolation_level=None)
    migrate(conn)
    conn.execute("INSERT INTO migrations VALUES ('9999_from_the_future', 0)")
    with pytest.raises(StoreError):
        migrate(conn)


def test_store_round_trip_survives_reopen(tmp_path):
    path = tmp_path / "app.db"
    store = ConversationStore(path)
    conv = store.create()
    store.append(conv.id, "user", "hello")
    report = ReplyReport(prompt_tokens=10, restored={"ram": 8}, cached_tokens=8, warmstart=True)
    store.append(conv.id, "assistant", "hi", report)
    store.set_pinned(conv.id, True)
    store.close()
    again = ConversationStore(path)
    assert again.get(conv.id).pinned
    msgs = again.messages(conv.id)
    assert [m.content for m in msgs] == ["hello", "hi"]
    assert msgs[1].report == report
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_store_search_order_and_truncate():
    store = ConversationStore(":memory:")
    a, b = store.create("Cats"), store.create("Dogs")
    store.append(a.id, "user", "whiskers 100%")
    store.append(b.id, "user", "bark")
    assert [c.id for c in store.conversations()] == [b.id, a.id]
    store.set_pinned(a.id, True)
    assert [c.id for c in store.conversations()] == [a.id, b.id]
    assert [c.id for c in store.conversations("WHISK")] == [a.id]
    assert [c.id for c in store.conversations("dog")] == [b.id]
    assert [c.id for c in store.conversations("100%")] == [a.id]
    store.truncate(a.id, 0)
    assert store.messages(a.id) == []
    store.delete(b.id)
    assert store.get(b.id) is None


def test_preferences_round_trip():
    store = ConversationStore(":memory:")
    assert Preferences.load(store) == Preferences()
    prefs = Preferences(model="/m.gguf", sampling=Sampling(temperature=0.2, stop=("x",)))
    prefs.save(store)
    assert Preferences.load(store) == prefs


# -- SSE and the client --------------------------------------------------------------


def test_sse_parsing_handles_comments_multiline_and_done():
    lines = [": ping", 'data: {"a":', "data: 1}", "", "event: x", "data: [DONE]", ""]
    assert list(iter_sse_json(lines)) == [{"a": 1}, DONE]


def sse(*payloads: object) -> bytes:
    out = b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads)
    return out + b"data: [DONE]\n\n"


def chunk(text: str | None = None, **extra: object) -> dict:
    delta = {"content": text} if text else {}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra}


X = {
    "prompt_tokens": 1826,
    "completion_tokens": 2,
    "restored": {"live": 0, "ram": 1812, "disk": 0},
    "restore_ms": 9.2,
    "prefill_ms": 80.4,
    "ttft_ms": 95.0,
    "finish_reason": "stop",
    "cached_tokens": 1812,
}


def client_for(handler) -> ApiClient:
    return ApiClient("http://test/v1", api_key="k" * 8, transport=httpx.MockTransport(handler))


def test_streaming_chat_yields_deltas_then_the_report():
    seen: dict = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["session"] = request.headers["X-Warmstart-Session"]
        seen["auth"] = request.headers["Authorization"]
        seen["body"] = json.loads(request.content)
        usage = {"prompt_tokens": 1826, "completion_tokens": 2}
        body = sse(chunk("Hel"), chunk("lo"), chunk(None, usage=usage, x_warmstart=X))
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    api = client_for(handler)
    events = list(
        api.chat(
            [{"role": "user", "content": "hi"}],
            session_id="c1",
            model=None,
            sampling=Sampling(seed=3),
        )
    )
    assert events[:2] == [TextDelta("Hel"), TextDelta("lo")]
    assert isinstance(events[-1], Finished)
    report = events[-1].report
    assert report.restored["ram"] == 1812 and report.hit_tier == "ram"
    assert seen["session"] == "c1" and seen["auth"] == "Bearer kkkkkkkk"
    assert seen["body"]["stream"] is True and seen["body"]["seed"] == 3
    assert format_status(report).startswith(
        "restored 1,812 tokens from RAM in 9 ms, prefilled 14 in 80 ms"
    )


def test_plain_openai_server_without_x_warmstart():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/v1/warmstart") or request.url.path == "/health":
            return httpx.Response(404, json={"error": {"message": "nope"}})
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "gpt-x"}]})
        usage = {
            "prompt_tokens": 5,
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 3},
        }
        return httpx.Response(200, content=sse(chunk("x"), chunk(None, usage=usage)))

    api = client_for(handler)
    assert api.health().ready
    assert api.sessions() is None and api.stats() is None and api.server_settings() is None
    events = list(api.chat([], session_id="c", model="gpt-x", sampling=Sampling()))
    report = events[-1].report
    assert not report.warmstart and report.cached_tokens == 3
    assert format_status(report).startswith("5 prompt tokens (3 cached by the server)")


@pytest.mark.parametrize(
    ("status", "error", "headers", "cls"),
    [
        (400, {"message": "too long", "code": "context_length_exceeded"}, {}, ContextFull),
        (404, {"message": "no such model", "code": "model_not_found"}, {}, ModelMissing),
        (429, {"message": "busy"}, {"Retry-After": "2"}, RateLimited),
    ],
)
def test_errors_map_to_the_tree(status, error, headers, cls):
    api = client_for(lambda r: httpx.Response(status, json={"error": error}, headers=headers))
    with pytest.raises(cls) as info:
        list(api.chat([], session_id="c", model=None, sampling=Sampling()))
    assert describe(info.value)
    if cls is RateLimited:
        assert info.value.retry_after == 2.0


def test_connection_refused_is_server_unavailable():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    api = client_for(handler)
    with pytest.raises(ServerUnavailable):
        api.health()
    with pytest.raises(ServerUnavailable):
        list(api.chat([], session_id="c", model=None, sampling=Sampling()))


def test_stats_are_read_tolerantly():
    snap = parse_stats(
        {
            "tiers": {"ram": {"used_bytes": 5, "capacity_bytes": 10}},
            "hits": {"ram": 3, "miss": 1},
            "extra": [1],
        }
    )
    assert snap.tiers["ram"].fill == 0.5 and snap.tiers["disk"].fill is None
    assert snap.hit_rate("ram") == 0.75
    assert parse_stats({}).hit_rate("ram") is None
    runtime_shape = {
        "hits": {"live": 3, "ram": 1, "disk": 0},
        "misses": 4,
        "tiers": {"live": {"sessions": 2, "capacity_sessions": 4, "bytes": 9}},
    }
    snap = parse_stats(runtime_shape)
    assert snap.tiers["live"].fill == 0.5 and snap.tiers["live"].used_bytes == 9
    assert snap.hit_rate("live") == 3 / 8


def test_a_degraded_disk_tier_is_read_and_said():
    from warmstart.app.core.report import format_degraded

    # the runtime's stats: the tier says it, with its reason
    snap = parse_stats(
        {"tiers": {"disk": {"degraded": True, "degraded_reason": "the cache disk is full"}}}
    )
    assert snap.degraded == {"disk": "the cache disk is full"}
    # /health's shape, and a tier that says nothing more
    assert parse_stats({"degraded": {"disk": "read-only"}}).degraded == {"disk": "read-only"}
    assert parse_stats({"tiers": {"disk": {"degraded": True}}}).degraded == {"disk": ""}
    assert (
        parse_stats({"tiers": {"disk": {"degraded": False, "degraded_reason": None}}}).degraded
        == {}
    )
    text = format_degraded(snap.degraded)
    assert text.startswith("Disk tier off: the cache disk is full. Replies come from RAM only")
    assert "comes back" in text
    assert format_degraded({"disk": ""}).startswith("Disk tier off: no reason given.")
    assert format_degraded({"ram": "x"}).startswith("RAM tier off: x.")
    assert format_degraded({}) == ""


def test_status_line_variants():
    miss = ReplyReport(prompt_tokens=20, prefill_ms=150, warmstart=True, ttft_ms=160)
    assert format_status(miss) == (
        "no cache hit: prefilled 20 tokens in 150 ms · first token after 160 ms"
    )
    both = ReplyReport(
        prompt_tokens=100,
        restored={"ram": 50, "disk": 40},
        cached_tokens=90,
        restore_ms=30,
        prefill_ms=12,
        warmstart=True,
        finish_reason="cancelled",
    )
    assert format_status(both) == (
        "restored 50 tokens from RAM and 40 from disk in 30 ms, prefilled 10 in 12 ms · stopped"
    )
