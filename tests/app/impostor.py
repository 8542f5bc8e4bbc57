"""An impostor on a loopback port: answers like a healthy server and records what it
receives. Used where the app expects its own local server."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

from tests.app.jsonhttp import JSONHandler


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Impostor:
    """``demand_key``: answer 401 without an Authorization header (like a real server
    with a key); otherwise accept anything. ``at_port``: the port to take (0: any)."""

    demand_key: bool = False
    at_port: int = 0
    seen: list[Seen] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Impostor:
        impostor = self

        class Handler(JSONHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                impostor.seen.append(Seen(self.command, self.path, headers, body))
                if impostor.demand_key and "authorization" not in headers:
                    self._send(401, {"error": {"message": "key", "type": "authentication_error"}})
                elif self.path == "/health":
                    self._send(200, {"status": "ok", "model": "impostor"})
                elif self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "impostor"}]})
                else:
                    self._send(200, {"object": "list", "data": []})

            do_GET = do_POST = do_DELETE = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", self.at_port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def received(self, secret: str) -> bool:
        """Whether ``secret`` appeared anywhere in what it was sent."""
        blob = repr([(s.path, s.headers, s.body) for s in self.seen])
        return secret in blob
