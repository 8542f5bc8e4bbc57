"""An attacker for the tests: many connections from one loopback address that send
complete request headers and then trickle their bodies a byte at a time.

On loopback every client is 127.0.0.1; the attacker binds another loopback address
(127.0.0.2) before connecting, so that "another client" is a different address to
the server."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

ATTACKER = "127.0.0.2"
HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
)


def connect_from(source: str, port: int, timeout: float = 2.0) -> socket.socket | None:
    sock = socket.socket()
    sock.settimeout(timeout)
    try:
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        sock.sendall(HEAD)
    except OSError:
        sock.close()
        return None
    return sock


def is_open(sock: socket.socket) -> bool:
    """Still open from the server's side (no FIN, no reset, nothing sent back)."""
    timeout = sock.gettimeout()
    sock.setblocking(False)  # with a timeout, recv would wait for it even with DONTWAIT
    try:
        sock.recv(1, socket.MSG_PEEK)  # b"" (closed) or an answer: either way not held
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(timeout)


class SlowBodies:
    """``count`` trickling connections from ``source``, kept at full strength (a closed
    one is opened again) by a thread until stop()."""

    def __init__(self, port: int, count: int = 300, source: str = ATTACKER) -> None:
        self.port, self.count, self.source = port, count, source
        self.socks: list[socket.socket] = []
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SlowBodies:
        self._fill()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for sock in self.socks:
            with contextlib.suppress(OSError):
                sock.close()

    def _fill(self) -> None:
        while len(self.socks) < self.count and not self._stop.is_set():
            sock = connect_from(self.source, self.port)
            if sock is None:
                return
            self.socks.append(sock)
            self.opened += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            for sock in list(self.socks):  # one more byte each: still "sending the body"
                if not is_open(sock) or not _send(sock):
                    self.socks.remove(sock)
                    sock.close()
            self._fill()
            time.sleep(0.5)


def _send(sock: socket.socket) -> bool:
    try:
        sock.send(b" ")
    except OSError:
        return False
    return True
