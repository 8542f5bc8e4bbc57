"""What a generating route reads of the client besides its body: the session header
(which names the conversation) and its socket (whose send queue shows a reader that
stopped)."""

from __future__ import annotations

import socket
from typing import Annotated

from fastapi import Header, Request
from pydantic import AfterValidator

from ._schemas import safe_session_id

SessionHeader = Annotated[
    str | None,
    Header(
        alias="X-Warmstart-Session",
        min_length=1,
        max_length=256,
        description="names the conversation, so its cache is found even when edited",
    ),
    AfterValidator(lambda v: v if v is None else safe_session_id(v)),
]


def peer_socket(request: Request) -> socket.socket | None:
    """The client's socket, when the server is warmstart's own (not a test client)."""
    sockets = getattr(request.app.state, "peer_sockets", None)
    client = request.scope.get("client")
    return sockets.get(tuple(client)[:2]) if sockets is not None and client else None
