"""A recording reverse proxy between a front end and warmstart.

A front end talks to warmstart from its own server process, so the browser never sees
those requests. The test points the front end at this proxy instead: every request is
passed on unchanged (streams stay streams) and recorded with its status and, for a
generation, the cache report warmstart put in the reply (``x_warmstart``, the same block
on /v1 and /api). That is the log of every route the front end calls and every 4xx/5xx,
and the cached-token figures of each request, whatever the dialect.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

# Headers that belong to one hop: the proxy's own connections set them.
_HOP = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "accept-encoding"}
)
# The routes that generate, in the dialects a front end may speak.
GENERATION_PATHS = frozenset(
    {"/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions"}
)
# Open WebUI's task prompts (title, tags, follow-ups, queries, ...) all start so.
TASK_MARK = "### Task:"


@dataclass(frozen=True)
class Exchange:
    """One request the front end made, and what warmstart answered."""

    method: str
    path: str
    status: int
    body: dict[str, Any] | None
    report: dict[str, Any] | None  # x_warmstart of a generation

    @property
    def is_generation(self) -> bool:
        return self.report is not None

    @property
    def is_user_chat(self) -> bool:
        """A message the user sent (answered or refused), not a background task."""
        return self.path in GENERATION_PATHS and not self.is_task

    @property
    def is_task(self) -> bool:
        """A background request (title, tags, follow-ups) rather than the user's chat."""
        return TASK_MARK in _last_user_text(self.body)

    @property
    def prompt_tokens(self) -> int:
        return int((self.report or {}).get("prompt_tokens", 0))

    @property
    def cached_tokens(self) -> int:
        return int((self.report or {}).get("cached_tokens", 0))

    def line(self) -> str:
        """One log line: method, path, status, and the cache figures of a generation."""
        text = f"{self.method} {self.path} -> {self.status}"
        if self.is_generation:
            kind = "task" if self.is_task else "chat"
            text += f" [{kind}: {self.cached_tokens}/{self.prompt_tokens} prompt tokens cached]"
        return text


@dataclass
class Recorder:
    """The exchanges so far, and how many requests are still open."""

    log: Path | None = None  # each exchange's line is appended as it ends
    exchanges: list[Exchange] = field(default_factory=list)
    in_flight: int = 0
    changed: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.changed = time.monotonic()

    def finish(self, exchange: Exchange) -> None:
        with self._lock:
            self.in_flight -= 1
            self.exchanges.append(exchange)
            self.changed = time.monotonic()
            if self.log is not None:
                with self.log.open("a") as out:
                    out.write(exchange.line() + "\n")

    def snapshot(self) -> list[Exchange]:
        with self._lock:
            return list(self.exchanges)

    def quiet_for(self) -> float:
        """Seconds since the last request started or ended, 0 while one is open."""
        with self._lock:
            return 0.0 if self.in_flight else time.monotonic() - self.changed


def _last_user_text(body: dict[str, Any] | None) -> str:
    if not body:
        return ""
    if isinstance(body.get("prompt"), str):
        return str(body["prompt"])
    users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    if not users:
        return ""
    content = users[-1].get("content")
    if isinstance(content, list):  # OpenAI's content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _json_objects(raw: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a reply: one body, SSE ``data:`` lines or NDJSON lines."""
    text = raw.decode("utf-8", errors="replace")
    lines = [text, *text.splitlines()]
    found = []
    for line in lines:
        line = line.strip().removeprefix("data:").strip()
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return [obj for obj in found if isinstance(obj, dict)]


def cache_report(raw: bytes | bytearray) -> dict[str, Any] | None:
    """The last ``x_warmstart`` block in a reply (a stream carries it in its last chunk)."""
    reports = [obj["x_warmstart"] for obj in _json_objects(raw) if "x_warmstart" in obj]
    return reports[-1] if reports else None


def _parse_body(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


@dataclass
class _Pending:
    """One request while it is open: what the recorder will keep of it."""

    method: str
    path: str
    status: int = 502  # until warmstart answers
    body: bytes = b""
    reply: bytearray = field(default_factory=bytearray)
    # its own connection to warmstart, closed with the exchange: a pooled client that
    # outlived the test left its sockets to the garbage collector (a ResourceWarning
    # that failed the next test)
    client: httpx.AsyncClient | None = None
    answer: httpx.Response | None = None

    async def close(self) -> None:
        if self.answer is not None:
            await self.answer.aclose()
        if self.client is not None:
            await self.client.aclose()

    def exchange(self) -> Exchange:
        return Exchange(
            self.method, self.path, self.status, _parse_body(self.body), cache_report(self.reply)
        )


def recording_app(upstream: str, recorder: Recorder) -> ASGIApp:
    """An app that passes every request on to ``upstream`` and records it."""

    async def forward(request: Request) -> StreamingResponse:
        pending: _Pending = request.scope["pending"]
        pending.client = client = httpx.AsyncClient(base_url=upstream, timeout=None)
        pending.body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers["accept-encoding"] = "identity"  # the recorder reads the reply's bytes
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        sent = client.build_request(request.method, path, headers=headers, content=pending.body)
        pending.answer = answer = await client.send(sent, stream=True)
        pending.status = answer.status_code

        async def relay():  # type: ignore[no-untyped-def]
            try:
                async for chunk in answer.aiter_raw():
                    pending.reply += chunk
                    yield chunk
            finally:
                await answer.aclose()

        kept = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
        return StreamingResponse(relay(), status_code=answer.status_code, headers=kept)

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    inner = Starlette(routes=[Route("/{path:path}", forward, methods=methods)])

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        # Counted and recorded around the whole exchange: a client that goes away
        # before the reply's first byte never starts the relay above, and a request
        # still counted as open would keep the test waiting.
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        scope["pending"] = pending = _Pending(scope["method"], scope["path"])
        recorder.start()
        try:
            await inner(scope, receive, send)
        finally:
            await pending.close()
            recorder.finish(pending.exchange())

    return app
