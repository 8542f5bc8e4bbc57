"""An attacker for the tests: many connections from one loopback address that send
complete request headers and then trickle their bodies a byte at a time.

On loopback every client is 127.0.0.1; the attacker binds another loopback address
(127.0.0.2) before connecting, so that "another client" is a different address to
the server. It runs in a process of its own (``python -m tests.api.slowbody PORT
COUNT``), so that its loop over hundreds of sockets does not slow the test's own
client, whose answer times are what the tests measure."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

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
    one is opened again) in a child process while the context is open; ``opened``
    (how many it opened in all) is known once it has closed."""

    def __init__(self, port: int, count: int = 300, source: str = ATTACKER) -> None:
        self._argv = [sys.executable, "-m", "tests.api.slowbody", str(port), str(count), source]
        self.opened = 0
        self._child: subprocess.Popen[str] | None = None

    def __enter__(self) -> SlowBodies:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self._child = subprocess.Popen(
            self._argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self._child.stdout is not None
        ready = self._child.stdout.readline()  # once the first round is open
        assert ready.startswith("open"), self._child.stderr.read() if self._child.stderr else ""
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._child is not None
        self._child.send_signal(signal.SIGTERM)
        out, _ = self._child.communicate(timeout=30)
        self.opened = int(out.split()[-1])


class _Attack:
    """The child's loop (see SlowBodies)."""

    def __init__(self, port: int, count: int = 300, source: str = ATTACKER) -> None:
        self.port, self.count, self.source = port, count, source
        self.socks: list[socket.socket] = []
        self.opened = 0
        self._stop = threading.Event()

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
            self._stop.wait(0.5)


def _send(sock: socket.socket) -> bool:
    try:
        sock.send(b" ")
    except OSError:
        return False
    return True


def main() -> None:
    port, count, source = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    attack = _Attack(port, count, source)
    signal.signal(signal.SIGTERM, lambda *_: attack._stop.set())
    attack._fill()
    print("open", len(attack.socks), flush=True)
    attack._run()
    for sock in attack.socks:
        with contextlib.suppress(OSError):
            sock.close()
    print("opened", attack.opened, flush=True)


if __name__ == "__main__":
    main()
