"""A plain OpenAI-compatible server: ``/v1/models`` and streamed
``/v1/chat/completions`` with ``usage``, and nothing of warmstart's (404 for
``/health`` and ``/v1/warmstart/*``, no ``x_warmstart`` in the reply).

Why it exists: the app must still chat with any OpenAI-compatible server, and neither
warmstart's server nor its fake (``python -m warmstart.runtime.api --fake``) can drop their
extensions. It is deliberately no more than that one behaviour; everything else the
app's tests need comes from the real server or the runtime's fake.
Run ``python -m tests.app.plain_server --port N``.
"""

from __future__ import annotations

import argparse
import json
import time
from http.server import ThreadingHTTPServer
from typing import Any

from tests.app.jsonhttp import JSONHandler

MODEL = "plain-model"
REPLY = ["Hello", " from", " a", " plain", " server", "."]


class Handler(JSONHandler):
    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self._send(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
            return
        prompt = sum(4 + len(str(m.get("content", "")).split()) for m in body["messages"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in REPLY:
            self._event(self._chunk({"content": piece}, None))
        final = self._chunk({}, "stop")
        final["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": len(REPLY),
            "total_tokens": prompt + len(REPLY),
        }
        self._event(final)
        self.wfile.write(b"data: [DONE]\n\n")

    @staticmethod
    def _chunk(delta: dict[str, str], finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [choice],
        }

    def _event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    server = ThreadingHTTPServer(("127.0.0.1", parser.parse_args().port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
