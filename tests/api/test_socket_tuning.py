"""What the server sets on each connection's socket: a token's chunk leaves at once
(TCP_NODELAY, which asyncio leaves off on an accepted socket), and a Unix socket,
which has no such option, is served the same way."""

from __future__ import annotations

import socket
from typing import Any

from warmstart.runtime.api._protocol import _tune_socket


class _Transport:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def set_write_buffer_limits(self, high: int) -> None:
        self.high = high

    def get_extra_info(self, name: str) -> Any:
        return self.sock if name == "socket" else None


def test_an_accepted_tcp_socket_sends_each_chunk_at_once() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()) as client:
            accepted, _ = listener.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
                _tune_socket(_Transport(accepted))  # type: ignore[arg-type]
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
                client.sendall(b"x")
                assert accepted.recv(1) == b"x"


def test_a_unix_socket_is_tuned_without_error() -> None:
    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        _tune_socket(_Transport(left))  # type: ignore[arg-type]
        left.sendall(b"y")
        assert right.recv(1) == b"y"
