"""A fake backend that implements the app's ``Backend`` interface, without HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from warmstart.app.core.errors import ServerUnavailable, UntrustedServer
from warmstart.app.core.report import ReplyReport
from warmstart.app.core.types import (
    ChatEvent,
    Finished,
    Health,
    Sampling,
    ServerSetting,
    SessionMessage,
    SessionSummary,
    TextDelta,
)


class FakeStream:
    def __init__(
        self,
        pieces: list[str],
        report: ReplyReport,
        gate: threading.Event | None,
        up: bool = True,
    ):
        self.up = up
        self.pieces = pieces
        self.report = report
        self.gate = gate
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()
        if self.gate:
            self.gate.set()

    def __iter__(self) -> Iterator[ChatEvent]:
        if not self.up:  # like HTTP, the connection is made when iteration starts
            raise ServerUnavailable(FakeBackend.base_url, "ConnectError")
        for i, piece in enumerate(self.pieces):
            if i == 1 and self.gate is not None:
                self.gate.wait(10)  # hold after the first piece, so a test can press stop
            if self.cancelled.is_set():
                yield Finished(ReplyReport(finish_reason="cancelled", completion_tokens=i))
                return
            yield TextDelta(piece)
        yield Finished(self.report)


class FakeBackend:
    base_url = "http://127.0.0.1:1/v1"

    def __init__(self) -> None:
        self.up = True
        self.untrusted = False
        self.warmstart = True
        self.reply = ["Hello", " there", "!"]
        self.gate: threading.Event | None = None
        self.requests: list[dict[str, Any]] = []
        self.known: dict[str, int] = {}
        self.prewarmed: list[str] = []
        self.drafts: list[tuple[str, list[dict[str, str]]]] = []
        self.deleted: list[str] = []
        # what a warmstart server keeps of each conversation: its messages and title
        self.kept: dict[str, dict[str, Any]] = {}
        self.imports: list[list[dict[str, Any]]] = []

    def _check(self) -> None:
        if not self.up:
            raise ServerUnavailable(self.base_url, "ConnectError")

    def health(self) -> Health:
        self._check()
        return Health(status="ok", model="fake-model")

    def verify(self) -> None:
        self._check()
        if self.untrusted:
            raise UntrustedServer(self.base_url, "it answers without the app's key")

    def models(self) -> list[str]:
        self._check()
        return ["fake-model"]

    def load_model(self, name: str) -> float | None:
        self._check()
        return None  # like a server without warmstart's load route

    def chat(
        self,
        messages: list[dict[str, str]],
        *,
        session_id: str,
        model: str | None,
        sampling: Sampling,
    ) -> FakeStream:
        self.requests.append({"messages": messages, "session_id": session_id, "model": model})
        cached = self.known.get(session_id, 0)
        prompt = sum(len(m["content"].split()) + 4 for m in messages)
        self.known[session_id] = prompt + len(self.reply)
        entry = self.kept.setdefault(session_id, {"title": "", "created": 1.0})
        entry["title"] = entry["title"] or next(
            (m["content"][:60] for m in messages if m["role"] == "user"), ""
        )
        entry["messages"] = [*messages, {"role": "assistant", "content": "".join(self.reply)}]
        entry["updated"] = float(len(self.requests))  # a clock the tests control
        report = ReplyReport(
            prompt_tokens=prompt,
            completion_tokens=len(self.reply),
            restored={"ram": cached} if cached else {},
            restore_ms=9.0 if cached else 0.0,
            prefill_ms=80.0,
            ttft_ms=95.0,
            cached_tokens=cached,
            warmstart=self.warmstart,
        )
        return FakeStream(list(self.reply), report, self.gate, self.up)

    def sessions(self, search: str = "") -> list[SessionSummary] | None:
        self._check()
        if not self.warmstart:
            return None
        needle = search.casefold()
        return [
            self._summary(k)
            for k, entry in self.kept.items()
            if needle
            in " ".join([entry["title"], *(m["content"] for m in entry["messages"])]).casefold()
        ]

    def _summary(self, sid: str, messages: bool = False) -> SessionSummary:
        entry, n = self.kept[sid], self.known.get(sid, 0)
        return SessionSummary(
            id=sid,
            title=entry["title"],
            n_tokens=n,
            tiers={"ram": n},
            location="ram" if n else "none",
            updated=entry["updated"],
            created=entry["created"],
            messages=tuple(
                SessionMessage(m["role"], m["content"]) for m in entry["messages"] if messages
            ),
        )

    def session(self, session_id: str) -> SessionSummary | None:
        self._check()
        if not self.warmstart or session_id not in self.kept:
            return None
        return self._summary(session_id, messages=True)

    def delete_session(self, session_id: str) -> None:
        self.deleted.append(session_id)
        self.kept.pop(session_id, None)
        self.known.pop(session_id, None)

    def rename_session(self, session_id: str, title: str) -> None:
        if session_id in self.kept:
            self.kept[session_id]["title"] = title

    def import_sessions(self, sessions: list[dict[str, Any]]) -> dict[str, Any] | None:
        self._check()
        if not self.warmstart:
            return None
        self.imports.append(sessions)
        new = [s for s in sessions if s["id"] not in self.kept]
        for s in new:
            self.kept[s["id"]] = {k: s[k] for k in ("title", "created", "updated", "messages")}
        return {
            "imported": [s["id"] for s in new],
            "existing": [s["id"] for s in sessions if s not in new],
        }

    def prewarm(self, session_id: str) -> bool:
        self.prewarmed.append(session_id)
        return True

    def prefill(
        self, messages: list[dict[str, str]], *, session_id: str, model: str | None
    ) -> dict[str, Any] | None:
        self._check()
        self.drafts.append((session_id, messages))
        n = sum(len(m["content"].split()) for m in messages)
        return {"ready_tokens": max(0, n - 2), "prompt_tokens": n, "state": "ready"}

    def stats(self) -> dict[str, Any] | None:
        self._check()
        if not self.warmstart:
            return None
        return {
            "tiers": {"ram": {"used_bytes": 10, "capacity_bytes": 100}},
            "hits": {"ram": 1, "miss": 3},
        }

    def server_settings(self) -> dict[str, ServerSetting] | None:
        if not self.warmstart:
            return None
        return {"n_ctx": ServerSetting("n_ctx", 4096, "fits the VRAM")}
