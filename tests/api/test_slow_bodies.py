"""Slow request bodies cannot lock others out: 300 connections from one address that
send their headers and trickle their bodies leave /health and chat answering for
another address; one address holds at most its share of the connections; a body
slower than min_body_rate gets its 408 after the grace period, not after 30 s.

Under a 1,024-file limit, like a desktop session. The attacker connects from
127.0.0.2 (see slowbody.py); the other client is 127.0.0.1."""

from __future__ import annotations

import resource
import socket
import time
from typing import Any

import httpx
from warmstart.runtime.api._middleware import BODY_GRACE_S
from warmstart.runtime.api._protocol import client_key, per_client_bound

from tests.api.slowbody import ATTACKER, SlowBodies, connect_from, is_open
from tests.timing import median, slowest, timed

FD_LIMIT = 1024
MIN_RATE = 100  # bytes a second a body must average after the grace
PAUSE_S = 0.2  # between the slow client's bytes
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _port(srv: Any) -> int:
    return int(srv.base_url.rsplit(":", 1)[1])


def test_trickled_bodies_from_one_address_leave_others_served(start: Any) -> None:
    """Bounded by a chat without the attack, measured just before it (the slowest of
    three: the machine's present load is in the bound), against the medians of
    /health and chat under attack: one request preempted by other work does not
    decide, and a server whose slots the attack took would hang every request."""
    with start(preexec_fn=_fd_limit) as srv:
        chat = lambda: httpx.post(srv.v1 + "/chat/completions", json=CHAT, timeout=30)  # noqa: E731
        health = lambda: httpx.get(srv.base_url + "/health", timeout=30)  # noqa: E731
        assert chat().status_code == 200
        baseline = slowest(chat)
        healths: list[float] = []
        chats: list[float] = []
        with SlowBodies(_port(srv), count=300) as attack:
            deadline = time.monotonic() + 10  # past the grace period several times over
            while time.monotonic() < deadline or len(chats) < 5:
                took, reply = timed(health)
                assert reply.status_code == 200
                healths.append(took)
                took, reply = timed(chat)
                assert reply.status_code == 200, reply.text
                chats.append(took)
                time.sleep(0.3)
        assert attack.opened >= 300  # the attack was at full strength
        assert median(healths) < 3 * baseline, (baseline, healths)
        assert median(chats) < 3 * baseline, (baseline, chats)
        assert len(srv.log()) < 64_000, srv.log()[-2000:]


def test_one_address_holds_at_most_its_share(start: Any) -> None:
    env = {"WARMSTART_MIN_BODY_RATE": "0", "WARMSTART_MAX_CONNECTIONS_PER_CLIENT": "8"}
    with start(env=env, preexec_fn=_fd_limit) as srv:
        socks = [s for s in (connect_from(ATTACKER, _port(srv)) for _ in range(40)) if s]
        try:
            time.sleep(1.0)
            still = sum(is_open(s) for s in socks)
            assert 1 <= still <= 8, still
            # another address is not counted against that one
            assert httpx.get(srv.base_url + "/health", timeout=5).status_code == 200
        finally:
            for sock in socks:
                sock.close()


def test_a_body_below_the_minimum_rate_gets_408_after_the_grace(start: Any) -> None:
    """A byte each PAUSE_S against MIN_RATE bytes a second: its 408 comes once the grace
    and the bytes' allowance have passed (a twentieth more), within one pause of the
    client and ten /health requests' time (the slowest of three, timed just before on
    this machine); not after the body's 30 s timeout."""
    with start(env={"WARMSTART_MIN_BODY_RATE": str(MIN_RATE)}) as srv:
        baseline = slowest(lambda: httpx.get(srv.base_url + "/health", timeout=30))
        sock = connect_from("127.0.0.1", _port(srv))
        assert sock is not None
        with sock:
            sock.settimeout(PAUSE_S)
            t0 = time.monotonic()
            answer = b""
            while not answer and time.monotonic() - t0 < 60:  # a hang guard, not the bound
                try:
                    sock.send(b" ")  # 1 / PAUSE_S bytes a second
                    answer = sock.recv(200)
                except TimeoutError:
                    continue
                except OSError:
                    break
            took = time.monotonic() - t0
        assert answer.startswith(b"HTTP/1.1 408"), answer
        due = BODY_GRACE_S / (1 - 1 / (PAUSE_S * MIN_RATE))
        assert BODY_GRACE_S <= took < due + PAUSE_S + 10 * baseline, (took, due, baseline)


def test_a_fast_body_after_a_pause_is_accepted(start: Any) -> None:
    """Headers first, the body a second later (within the grace): served as usual."""
    with start() as srv:
        body = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
        with socket.create_connection(("127.0.0.1", _port(srv)), timeout=30) as sock:
            head = (
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            )
            sock.sendall(head)
            time.sleep(1.0)
            sock.sendall(body)
            assert sock.recv(200).startswith(b"HTTP/1.1 200")


def test_what_counts_as_one_client() -> None:
    assert client_key("127.0.0.2") == "127.0.0.2"
    assert client_key("::ffff:10.0.0.7") == "10.0.0.7"
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff") == "2001:db8::/64"
    assert client_key("2001:db8:0:1::1") != client_key("2001:db8::1")
    assert per_client_bound(32, 256) == 32
    assert per_client_bound(32, 20) == 10  # never the whole server
    assert per_client_bound(32, 4) == 2
