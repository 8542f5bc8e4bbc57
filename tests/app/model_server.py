"""A server with several models, in this process, for the model picker's tests.

It answers ``/health``, ``/v1/models``, ``POST /v1/warmstart/models/load`` (the
contract: 200 ``{"model", "loaded": true, "load_ms"}``, 404 ``model_not_found`` for an
unknown model) and streamed ``/v1/chat/completions`` whose reply names the model that
answered, and records the model every request names. Switches for the failures:
``load_error`` (answer loads with this status), ``load_route=False`` (an older server:
the route itself is missing), ``hold`` (loads wait until it is set).
Neither the runtime's fake nor the plain server has several models; the real server's
load route is being built elsewhere, and this is its contract, no more.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.app.jsonhttp import JSONHandler

LOAD_ROUTE = "/v1/warmstart/models/load"


@dataclass
class ModelServer:
    models: list[str] = field(default_factory=lambda: ["default", "other"])
    loaded: str = "default"
    load_error: int | None = None
    load_route: bool = True
    hold: threading.Event | None = None
    loads: list[str] = field(default_factory=list)  # the model of every load request
    chats: list[str | None] = field(default_factory=list)  # the model of every chat
    url: str = ""

    def reply_text(self, model: str) -> str:
        return f"Hello from {model}."


def _error(status: int, message: str, code: str | None, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}


def _handler(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(JSONHandler):
        def _missing(self, name: str) -> None:
            message = f"the model '{name}' does not exist"
            self._send(404, _error(404, message, "model_not_found", "invalid_request_error"))

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {"status": "ok", "model": server.loaded})
            elif self.path == "/v1/models":
                data = [{"id": m, "object": "model"} for m in server.models]
                self._send(200, {"object": "list", "data": data})
            else:
                self._send(404, _error(404, "Not Found", "not_found", "invalid_request_error"))

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if self.path == LOAD_ROUTE and server.load_route:
                self._load(str(body.get("model")))
            elif self.path == "/v1/chat/completions":
                self._chat(body)
            else:
                missing = f"Not Found: POST {self.path}"
                self._send(404, _error(404, missing, "not_found", "invalid_request_error"))

        def _load(self, name: str) -> None:
            server.loads.append(name)
            if server.hold is not None:
                server.hold.wait(30)
            if server.load_error == 500:
                message = f"not enough memory to load '{name}'"
                self._send(500, _error(500, message, None, "server_error"))
            elif server.load_error is not None or name not in server.models:
                self._missing(name)
            else:
                server.loaded = name
                self._send(200, {"model": name, "loaded": True, "load_ms": 1234})

        def _chat(self, body: dict[str, Any]) -> None:
            model = body.get("model")
            server.chats.append(model)
            if model not in (None, "default", *server.models):
                self._missing(str(model))
                return
            answering = server.loaded if model in (None, "default") else str(model)
            server.loaded = answering  # a request naming a model loads it, as Ollama does
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for piece in server.reply_text(answering).split(" "):
                self._event({"content": piece + " "}, None, answering)
            self._event({}, "stop", answering)
            self.wfile.write(b"data: [DONE]\n\n")

        def _event(self, delta: dict[str, str], finish: str | None, model: str) -> None:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            payload = {
                "id": "c", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": model, "choices": [choice],
            }  # fmt: skip
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()

    return Handler


@contextmanager
def serve_models(server: ModelServer) -> Iterator[ModelServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    httpd.daemon_threads = True
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        if server.hold is not None:
            server.hold.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
