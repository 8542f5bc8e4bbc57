"""Trickling connections (slowloris) against a server with a low descriptor limit:
/health keeps answering, stalled connections are closed, the log stays small.
Loopback only, bounded in count (400) and time (about 10 s)."""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from typing import Any

import httpx
from warmstart.runtime.api._logs import RepeatFilter
from warmstart.runtime.api._protocol import fd_budget

from tests.timing import median, slowest, timed

FD_LIMIT = 256
ATTACKERS = 400
HEADER_TIMEOUT_S = 1


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _trickle(port: int) -> socket.socket | None:
    sock = socket.socket()
    sock.settimeout(2)
    try:
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    except OSError:
        sock.close()
        return None
    return sock


def test_trickling_connections_do_not_stop_health(start: Any) -> None:
    """/health under attack answers, at its median, within 3x of a small chat without
    the attack (the slowest of three, measured just before it on this machine), and the
    server never runs out of descriptors to accept it with."""
    env = {"WARMSTART_HEADER_TIMEOUT": "3", "WARMSTART_MAX_CONNECTIONS": "1000"}
    with start(env=env, preexec_fn=_low_fd_limit) as srv:
        port = int(srv.base_url.rsplit(":", 1)[1])
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        baseline = slowest(lambda: httpx.post(srv.v1 + "/chat/completions", json=chat, timeout=30))
        socks: list[socket.socket] = []
        try:
            healths: list[float] = []
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline or len(healths) < 5:
                while len(socks) < ATTACKERS:  # keep the attack at full strength
                    sock = _trickle(port)
                    if sock is None:
                        break
                    socks.append(sock)
                for sock in list(socks):  # one more byte each: still "sending headers"
                    try:
                        sock.send(b"a")
                    except OSError:
                        socks.remove(sock)
                        sock.close()
                took, health = timed(lambda: httpx.get(srv.base_url + "/health", timeout=30))
                assert health.status_code == 200
                healths.append(took)
                time.sleep(0.5)
            assert median(healths) < 3 * baseline, (baseline, healths)
        finally:
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.close()
        log = srv.log()
        assert len(log) < 64_000, log[-2000:]
        # out of descriptors, asyncio stops accepting anyone, /health too, for a second
        assert "out of system resource" not in log, log[-2000:]


def test_stalled_headers_are_timed_out(start: Any) -> None:
    """Closed after header_timeout plus ten /health requests' time (the slowest of three,
    timed just before on this machine): the server's event loop runs the timer as late
    as it answers them; the default timeout would be 10 s."""
    with start(env={"WARMSTART_HEADER_TIMEOUT": str(HEADER_TIMEOUT_S)}) as srv:
        port = int(srv.base_url.rsplit(":", 1)[1])
        baseline = slowest(lambda: httpx.get(srv.base_url + "/health", timeout=30))
        sock = _trickle(port)
        assert sock is not None
        with sock:
            sock.settimeout(60)  # a hang guard, not the bound
            took, data = timed(lambda: sock.recv(100))
            assert data == b""  # closed by the server
            assert took < HEADER_TIMEOUT_S + 10 * baseline, (took, baseline)


def test_a_body_that_never_arrives_gets_408(start: Any) -> None:
    with start(env={"WARMSTART_BODY_TIMEOUT": "1"}) as srv:
        port = int(srv.base_url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
            )
            assert sock.recv(200).startswith(b"HTTP/1.1 408")


def test_connections_stay_under_the_descriptor_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fds = fd_budget(10**6)
    limit = max(soft, hard if hard != resource.RLIM_INFINITY else 10**9)
    assert fds.connections + 2 * fds.accept_burst <= limit
    assert fd_budget(8).connections == 8


def test_repeats_are_rate_limited() -> None:
    now = [0.0]
    repeat = RepeatFilter(burst=3, window=10, clock=lambda: now[0])
    import logging

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("x", logging.ERROR, __file__, 1, msg, None, None)

    passed = [repeat.filter(record("accept failed")) for _ in range(100)]
    assert sum(passed) == 3
    assert repeat.filter(record("something else"))
    now[0] = 11
    later = record("accept failed")
    assert repeat.filter(later) and "97 similar messages suppressed" in later.msg
