"""A local imitation of the Hugging Face hub's file endpoints and PyPI's JSON API.

HEAD and GET of ``/{owner}/{repo}/resolve/{revision}/{file}`` with the headers
huggingface_hub reads, HTTP ranges, and a switch that stalls the first download
after some bytes (so a test can kill the pulling process mid-file).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "c0ffee" * 6 + "c0ff"


@dataclass
class Hub:
    files: dict[str, bytes] = field(default_factory=dict)  # url path -> bytes
    json: dict[str, bytes] = field(default_factory=dict)  # url path -> JSON body
    stall_after: int | None = None  # the first GET sends this many bytes, then hangs
    sent: int = 0
    ranges: list[str | None] = field(default_factory=list)  # Range of every GET
    release: threading.Event = field(default_factory=threading.Event)
    url: str = ""
    throttle: float = 0.0  # seconds between 64 KiB pieces of a GET: a slow line

    def add_hub_file(self, repo: str, filename: str, data: bytes, revision: str = "main") -> str:
        self.files[f"/{repo}/resolve/{revision}/{filename}"] = data
        return hashlib.sha256(data).hexdigest()


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _find(self) -> bytes | None:
            path = self.path.split("?", 1)[0]
            if path in hub.json:
                return hub.json[path]
            return hub.files.get(path)

        def do_HEAD(self) -> None:
            data = self._find()
            if data is None:
                self.send_error(404)
                return
            self.send_response(200)
            self._headers(data, len(data))
            self.end_headers()

        def _headers(self, data: bytes, length: int) -> None:
            self.send_header("Content-Length", str(length))
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Accept-Ranges", "bytes")

        def do_GET(self) -> None:
            data = self._find()
            if data is None:
                self.send_error(404)
                return
            wanted = self.headers.get("Range")
            hub.ranges.append(wanted)
            start = int(wanted.split("=")[1].split("-")[0]) if wanted else 0
            body = data[start:]
            self.send_response(206 if wanted else 200)
            self._headers(data, len(body))
            if wanted:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            stall = hub.stall_after
            if stall is not None and start == 0:
                hub.stall_after = None
                # its last bytes come on their own, as on a slow line: a client that
                # keeps a small write in its buffer has less on disk than it received
                for piece in (body[: stall - 3072], body[stall - 3072 : stall]):
                    self.wfile.write(piece)
                    self.wfile.flush()
                    time.sleep(0.2)
                hub.sent = stall
                hub.release.wait(60)  # until the test has killed the client
                self.close_connection = True
                return
            if not hub.throttle:
                self.wfile.write(body)
                return
            for at in range(0, len(body), 1 << 16):
                self.wfile.write(body[at : at + (1 << 16)])
                self.wfile.flush()
                time.sleep(hub.throttle)

    return Handler


@contextmanager
def serve_hub(hub: Hub) -> Iterator[Hub]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
