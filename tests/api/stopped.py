"""A client that sends a streamed request and stops reading, and the bound on how
soon the server cancels it, measured on this machine at its present load.

The server notices a reader that stopped when its kernel send queue stops draining
(api/_sse.py): the time that takes is the time the server needs to produce what the
stopped socket's small receive buffer holds, plus send_timeout and a poll. So the
bound is the bytes the stuck socket holds once cancelled, timed to a reader that
reads them (``seconds_to_receive``, the same request), plus send_timeout and a
poll, twice that for the load's noise. Waiting instead for the socket and transport
buffers (~100 KB) to fill takes many times longer."""

from __future__ import annotations

import contextlib
import fcntl
import json
import socket
import struct
import termios
import time
from typing import Any

from warmstart.runtime.api._sse import QUEUE_POLL_S


def stream_raw(port: int, path: str, request: dict[str, Any]) -> socket.socket:
    """``request`` POSTed to ``path`` on a raw socket with a small receive buffer,
    nothing read."""
    body = json.dumps(request).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def unread(sock: socket.socket) -> int:
    """Bytes in the socket's receive queue, not read (FIONREAD)."""
    raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    return int(struct.unpack("i", raw)[0])


def seconds_to_receive(port: int, path: str, request: dict[str, Any], size: int) -> float:
    """Seconds from sending ``request`` until a reader that reads has ``size`` bytes."""
    t0 = time.monotonic()
    with contextlib.closing(stream_raw(port, path, request)) as sock:
        received = 0
        while received < size:
            data = sock.recv(65536)
            assert data, f"the stream ended after {received} bytes"
            received += len(data)
    return time.monotonic() - t0


def cancel_bound(fill_s: float, send_timeout_s: float) -> float:
    """How soon a reader that stopped must be cancelled (see the module docstring)."""
    return 2 * (fill_s + send_timeout_s + QUEUE_POLL_S)
