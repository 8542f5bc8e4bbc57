"""uvicorn's h11 protocol with the bounds a server on a LAN needs.

uvicorn times out only idle keep-alive connections: a client that trickles its
headers one byte at a time holds its connection (and a file descriptor) forever,
and a thousand of them exhaust ``ulimit -n`` so that /health cannot be accepted.
Here each connection gets ``header_timeout`` seconds to send a request's headers
(from the moment it opens or its last response ended), open connections are capped
(the oldest one that is waiting for headers makes room for a new one, so trickling
clients cannot keep others out), and the socket holds little unsent data, so a
client that stops reading blocks our sends soon (see SSEResponse's send_timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
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
    # the open connections' sockets by peer (host, port): a streamed reply watches
    # its kernel send queue to notice a client that stopped reading (see _sse.py)
    sockets: dict[tuple[Any, ...], socket.socket] = field(default_factory=dict)


def fd_bounded(max_connections: int) -> int:
    """``max_connections``, lowered to fit the process's descriptor limit (raised to
    its hard limit first: Python keeps the shell's soft limit, often 1,024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # not allowed here: keep the soft limit
            pass
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(4, min(max_connections, soft - RESERVED_FDS))


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
        sock = transport.get_extra_info("socket")
        if sock is not None and self._peer:
            self._limits.sockets[self._peer] = sock
        if len(self.connections) > self._limits.max_connections and not self._make_room():
            log.warning("%d connections open; refusing a new one", len(self.connections))
            transport.close()
            return
        self._arm_header_timer()

    def _make_room(self) -> bool:
        """Closes the oldest connection waiting for request headers."""
        idle = [c for c in self.connections if isinstance(c, _GuardedH11) and c._between()]
        idle = [c for c in idle if c is not self]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c._opened)
        oldest.transport.close()
        self.connections.discard(oldest)
        return True

    def _between(self) -> bool:
        """No request in progress: waiting for (the rest of) the next headers."""
        return self.cycle is None or bool(self.cycle.response_complete)

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
