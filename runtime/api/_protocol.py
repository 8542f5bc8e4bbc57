"""uvicorn's h11 protocol with the bounds a server on a LAN needs.

uvicorn times out only idle keep-alive connections: a client that trickles its
headers one byte at a time holds its connection (and a file descriptor) forever,
and a thousand of them exhaust ``ulimit -n`` so that /health cannot be accepted.
Here each connection gets ``header_timeout`` seconds to send a request's headers
(from the moment it opens or its last response ended), and its body must keep up a
minimum rate (BodyLimitMiddleware). Open connections are capped, in all and per
client address (an IPv6 /64 counts as one address: a host gets a whole prefix): a
new connection over a cap closes the oldest one that is still sending headers or a
body (under that address, for its cap), and is refused when none is. So trickling
clients hold at most their address's share and cannot keep others out. The socket
holds little unsent data, so a client that stops reading blocks our sends soon (see
SSEResponse's send_timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import resource
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

# Bytes the kernel queues per socket (it doubles the figure; autotuning grows it to
# megabytes on loopback otherwise), and the transport's buffer above it: kept small so
# that a reader who stopped is noticed after tens of kilobytes. Replies here are small
# and the LAN's bandwidth-delay product is too: throughput does not suffer.
SEND_BUFFER = 32 << 10
WRITE_HIGH_WATER = 32 << 10
# Descriptors kept for the model, the databases and the cache files.
RESERVED_FDS = 64


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout: float
    per_client: int = 1 << 30  # open connections from one client address
    # the open connections' sockets by peer (host, port): a streamed reply watches
    # its kernel send queue to notice a client that stopped reading (see _sse.py)
    sockets: dict[tuple[Any, ...], socket.socket] = field(default_factory=dict)


# asyncio accepts up to ``backlog`` connections each time the listening socket wakes it
# and makes their protocols (which close what is over the caps) only after the whole
# burst, the closes a loop turn later still: for a moment a burst holds its descriptors
# on top of the open connections, and as many closing ones. Out of descriptors, asyncio
# stops accepting for a whole second (ACCEPT_RETRY_DELAY): under trickling clients
# /health took 1.01 s every other request with uvicorn's backlog, 2,048, and 256
# descriptors (CI, 2026-12-06). So a burst is a share of the descriptors, and the
# connections get what two bursts leave; the kernel's queue stays LISTEN_QUEUE deep
# (what waits there holds no descriptor of ours).
LISTEN_QUEUE = 2048


@dataclass(frozen=True)
class FdBudget:
    connections: int  # open connections at most
    accept_burst: int  # connections asyncio accepts at once (its ``backlog``)


def fd_budget(max_connections: int) -> FdBudget:
    """``max_connections``, lowered to fit the process's descriptor limit (raised to
    its hard limit first: Python keeps the shell's soft limit, often 1,024) beside two
    bursts of accepted connections, and the size of a burst."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # not allowed here: keep the soft limit
            pass
    if soft == resource.RLIM_INFINITY:
        return FdBudget(max_connections, LISTEN_QUEUE)
    room = max(16, soft - RESERVED_FDS)
    burst = max(2, min(LISTEN_QUEUE, room // 8))
    return FdBudget(max(4, min(max_connections, room - 2 * burst)), burst)


def per_client_bound(per_client: int, max_connections: int) -> int:
    """The per-address cap, at most half of all connections: one address can then
    never take every connection, whatever the descriptor limit left."""
    return max(1, min(per_client, max_connections // 2))


def client_key(host: object) -> str:
    """What counts as one client: its IPv4 address (also when mapped into IPv6), the
    /64 prefix of an IPv6 one; the text itself for anything else (a Unix socket)."""
    try:
        ip = ipaddress.ip_address(str(host))
    except ValueError:
        return str(host)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def protocol_class(limits: ConnectionLimits) -> type[H11Protocol]:
    """An H11Protocol subclass bound to ``limits`` (uvicorn takes a class)."""

    class Guarded(_GuardedH11):
        _limits = limits

    return Guarded


class _GuardedH11(H11Protocol):
    _limits: ConnectionLimits

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened = time.monotonic()
        self._header_timer: asyncio.TimerHandle | None = None
        self._waiting_cycle: Any = None
        _tune_socket(transport)
        self._peer = tuple((transport.get_extra_info("peername") or ())[:2])
        self._client = client_key(self._peer[0]) if self._peer else ""
        sock = transport.get_extra_info("socket")
        if sock is not None and self._peer:
            self._limits.sockets[self._peer] = sock
        if not self._admitted():
            transport.close()
            return
        self._arm_header_timer()

    def _admitted(self) -> bool:
        """Room for this connection under both caps, made by closing a slow one if need
        be. The refusals are logged (rate-limited: see _logs.py), never one a line."""
        mine = [c for c in self._guarded() if c._client == self._client]
        if len(mine) >= self._limits.per_client and not self._make_room(mine):
            log.warning("%d connections open from %s; refusing a new one", len(mine), self._client)
            return False
        full = len(self.connections) > self._limits.max_connections
        if full and not self._make_room(self._guarded()):
            log.warning("%d connections open; refusing a new one", len(self.connections))
            return False
        return True

    def _guarded(self) -> list[_GuardedH11]:
        return [c for c in self.connections if isinstance(c, _GuardedH11) and c is not self]

    def _make_room(self, among: list[_GuardedH11]) -> bool:
        """Closes the oldest of ``among`` that is waiting for request headers or still
        receiving a request body; False when none is."""
        slow = [c for c in among if c._between() or c._receiving()]
        if not slow:
            return False
        oldest = min(slow, key=lambda c: c._opened)
        oldest.transport.close()
        self.connections.discard(oldest)
        return True

    def _between(self) -> bool:
        """No request in progress: waiting for (the rest of) the next headers."""
        return self.cycle is None or bool(self.cycle.response_complete)

    def _receiving(self) -> bool:
        """A request whose headers are in and whose body is not (nothing is computed
        for it yet: closing it loses the client nothing it was promised)."""
        cycle = self.cycle
        return cycle is not None and bool(cycle.more_body) and not cycle.response_started

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._waiting_cycle = self.cycle
        self._header_timer = self.loop.call_later(
            self._limits.header_timeout, self._on_header_timeout
        )

    def _cancel_header_timer(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self._between() and not self.transport.is_closing():
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self._header_timer is not None and self.cycle is not self._waiting_cycle:
            self._cancel_header_timer()  # a new request's headers are complete

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self._limits.sockets.pop(getattr(self, "_peer", ()), None)
        super().connection_lost(exc)


def _tune_socket(transport: asyncio.Transport) -> None:
    transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError):  # else the send timeout applies, after more buffering
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        # Each token's chunk leaves the moment it is written, whether or not the client
        # has acknowledged the last one yet (Nagle's algorithm would hold it back until
        # then). asyncio sets TCP_NODELAY only on sockets made with
        # proto=IPPROTO_TCP, and an accepted socket has proto 0, so it was off here.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
