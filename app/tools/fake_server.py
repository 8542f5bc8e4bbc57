"""A stand-in server that speaks the app's API contract, for UI development, the app's
tests and the screenshot script, with no model and no runtime.

It imitates warmstart's tiers just enough for the app's panels to show something true
to life: the most recent conversation is "live", the three before it sit in "ram", the
rest on "disk", and after a restart (``--state FILE``) every conversation is on disk.
Run ``python -m app.tools.fake_server --port 8765``; ``--plain`` drops everything
warmstart-specific, to look like any other OpenAI-compatible server.

Magic words in the last user message: ``/long`` gives a long, slow reply (to press
Stop), ``/context-full`` answers with the context_length_exceeded error.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
MODEL = "smollm2-135m-instruct (fake)"
KV_BYTES_PER_TOKEN = 23_052
LIVE_SLOTS, RAM_SLOTS = 1, 3
CAPACITY = {"live": 64 << 20, "ram": 256 << 20, "disk": 2 << 30}
RESTORE_MS = {"live": 0.4, "ram": 9.0, "disk": 48.0}
SETTINGS = {
    "n_ctx": {"value": 8192, "reason": "fits 4 resident conversations in 2.1 GB of free VRAM"},
    "resident_sequences": {"value": 4, "reason": "free VRAM after weights / KV per conversation"},
    "ram_pool_bytes": {"value": 268435456, "reason": "25% of free RAM, capped at 256 MB"},
    "disk_budget_bytes": {"value": 2147483648, "reason": "5% of the free space on an NVMe disk"},
    "chunk_tokens": {"value": 256, "reason": "default; restore copies stay above 4 MB"},
    "swap_in_threshold_tokens": {"value": 64, "reason": "restore beats prefill above 64 tokens"},
    "zstd_level": {"value": 0, "reason": "NVMe reads outrun zstd decompression here"},
    "prewarm_sessions": {"value": 3, "reason": "RAM pool holds the 3 most recent chats"},
}


def count_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(4 + len(str(m.get("content", "")).split()) for m in messages)


class State:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.sessions: dict[str, dict[str, Any]] = {}
        self.hits = {"live": 0, "ram": 0, "disk": 0, "miss": 0}
        if path and path.exists():
            for sid, s in json.loads(path.read_text()).items():
                self.sessions[sid] = {**s, "location": "disk"}

    def lookup(self, sid: str, prompt_tokens: int) -> tuple[str, int]:
        with self.lock:
            s = self.sessions.get(sid)
            if not s or not s["n_tokens"]:
                self.hits["miss"] += 1
                return "none", 0
            self.hits[s["location"]] += 1
            return s["location"], min(s["n_tokens"], prompt_tokens - 1)

    def record(self, sid: str, title: str, n_tokens: int) -> None:
        with self.lock:
            now = time.time()
            s = self.sessions.setdefault(sid, {"title": title, "created": now})
            s.update(updated=now, n_tokens=n_tokens)
            order = sorted(self.sessions, key=lambda k: -self.sessions[k]["updated"])
            for i, key in enumerate(order):
                tier = "live" if i < LIVE_SLOTS else "ram" if i < LIVE_SLOTS + RAM_SLOTS else "disk"
                if self.sessions[key].get("location") != "disk" or key == sid:
                    self.sessions[key]["location"] = tier
            if self.path:
                keep = {
                    k: {x: v[x] for x in v if x != "location"} for k, v in self.sessions.items()
                }
                self.path.write_text(json.dumps(keep))

    def session_list(self) -> list[dict[str, Any]]:
        with self.lock:
            out = []
            for sid, s in self.sessions.items():
                tiers = dict.fromkeys(("live", "ram", "disk"), 0)
                tiers[s["location"]] = s["n_tokens"]
                if s["location"] != "disk":
                    tiers["disk"] = s["n_tokens"]  # written through to disk in the background
                out.append({"id": sid, **s, "tiers": tiers})
            return out

    def stats(self) -> dict[str, Any]:
        used = dict.fromkeys(CAPACITY, 0)
        for s in self.session_list():
            for tier, n in s["tiers"].items():
                used[tier] += n * KV_BYTES_PER_TOKEN
        tiers = {t: {"used_bytes": used[t], "capacity_bytes": CAPACITY[t]} for t in CAPACITY}
        return {"tiers": tiers, "hits": dict(self.hits), "sessions": len(self.sessions)}


def reply_text(question: str) -> str:
    if "/long" in question:
        return " ".join(f"word{i}" for i in range(400))
    return (
        f"You asked: *{question.strip()[:80]}*.\n\n"
        "Here is a **short** answer with code:\n\n"
        '```python\ndef greet(name):\n    return f"hello {name}"\n```\n\n'
        "- restored prefixes skip the prefill\n- new tokens are prefilled\n"
    )


class Handler(BaseHTTPRequestHandler):
    server: FakeServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, code: str | None = None) -> None:
        self._json(
            status,
            {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": code,
                }
            },
        )

    def _warmstart_only(self) -> bool:
        if self.server.plain:
            self._error(404, "not found")
            return False
        return True

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/health":
            if self.server.plain:
                return self._error(404, "not found")
            loading = self.server.ready_at - time.monotonic()
            if loading > 0:
                progress = 1 - loading / max(self.server.load_seconds, 1e-6)
                return self._json(503, {"status": "loading", "model": MODEL, "progress": progress})
            return self._json(200, {"status": "ok", "model": MODEL})
        if path == "/v1/models":
            return self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        if not self._warmstart_only():
            return None
        if path == "/v1/warmstart/sessions":
            return self._json(200, {"data": self.server.state.session_list()})
        if path == "/v1/warmstart/stats":
            return self._json(200, self.server.state.stats())
        if path == "/v1/warmstart/settings":
            return self._json(200, SETTINGS)
        return self._error(404, f"no route {path}")

    def do_DELETE(self) -> None:
        m = re.fullmatch(r"/v1/warmstart/sessions/([\w-]+)", self.path)
        if not self._warmstart_only() or not m:
            return None
        with self.server.state.lock:
            self.server.state.sessions.pop(m.group(1), None)
        return self._json(200, {"id": m.group(1), "deleted": True})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        m = re.fullmatch(r"/v1/warmstart/sessions/([\w-]+)/prewarm", self.path)
        if m:
            if not self._warmstart_only():
                return None
            known = m.group(1) in self.server.state.sessions
            return self._json(200 if known else 404, {"id": m.group(1), "prewarmed": known})
        if self.path != "/v1/chat/completions":
            return self._error(404, f"no route {self.path}")
        if self.server.ready_at > time.monotonic():
            return self._error(503, "the model is still loading")
        return self._chat(body)

    def _chat(self, body: dict[str, Any]) -> None:
        messages = body.get("messages") or []
        question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        if "/context-full" in question:
            return self._error(
                400, "the prompt needs 9000 tokens; n_ctx is 8192", "context_length_exceeded"
            )
        sid = self.headers.get("X-Warmstart-Session") or body.get("user") or "anonymous"
        started = time.perf_counter()
        prompt_tokens = count_tokens(messages)
        tier, cached = self.server.state.lookup(sid, prompt_tokens)
        restore_ms = RESTORE_MS.get(tier, 0.0)
        prefill_ms = (prompt_tokens - cached) * 2.0
        pieces = re.findall(r"\S+\s*|\s+", reply_text(question))[: int(body.get("max_tokens", 512))]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        finish, sent, ttft = "stop", 0, None
        try:
            for piece in pieces:
                time.sleep(self.server.token_delay)
                self._event(self._chunk({"content": piece}, None))
                ttft = ttft or (time.perf_counter() - started) * 1000 + restore_ms + prefill_ms
                sent += 1
            if sent < len(pieces):
                finish = "length"
        except (BrokenPipeError, ConnectionResetError):
            finish = "cancelled"
        self.server.state.record(sid, question[:40], prompt_tokens + sent)
        if finish == "cancelled":
            return None
        restored = dict.fromkeys(("live", "ram", "disk"), 0)
        if tier != "none":
            restored[tier] = cached
        x = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": sent,
            "restored": restored,
            "restore_ms": restore_ms,
            "prefill_ms": prefill_ms,
            "ttft_ms": ttft or 0.0,
            "total_ms": (time.perf_counter() - started) * 1000,
            "finish_reason": finish,
            "decision": "restore" if cached else "recompute",
            "session_id": sid,
            "cached_tokens": cached,
            "prefilled_tokens": prompt_tokens - cached,
        }
        final = self._chunk({}, finish)
        final["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": sent,
            "total_tokens": prompt_tokens + sent,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        if not self.server.plain:
            final["x_warmstart"] = x
        try:
            self._event(final)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        return None

    def _chunk(self, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def _event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        port: int,
        *,
        state_file: Path | None = None,
        plain: bool = False,
        token_delay: float = 0.01,
        load_seconds: float = 0.0,
    ) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.state = State(state_file)
        self.plain = plain
        self.token_delay = token_delay
        self.load_seconds = load_seconds
        self.ready_at = time.monotonic() + load_seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--state", type=Path, help="keep sessions here across restarts")
    parser.add_argument("--plain", action="store_true", help="no warmstart extensions")
    parser.add_argument("--token-delay", type=float, default=0.01, help="seconds per token")
    parser.add_argument("--load-seconds", type=float, default=0.0, help="pretend to load")
    args = parser.parse_args(argv)
    server = FakeServer(
        args.port,
        state_file=args.state,
        plain=args.plain,
        token_delay=args.token_delay,
        load_seconds=args.load_seconds,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
