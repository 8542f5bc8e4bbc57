"""Anthropic's Messages API on the same port: /v1/messages, /v1/messages/count_tokens.

The same runtime serves it, so a conversation here finds the cache and the tool
machinery of /v1/chat/completions, and the same middleware guards it (the API key,
sent as ``x-api-key`` or ``Authorization: Bearer``; Host and Origin; body size).
Replies carry Anthropic's usage with ``cache_read_input_tokens`` and warmstart's
cache report (``x_warmstart``); errors are in Anthropic's shape (_anthropic_stream).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..types import Request as RuntimeRequest
from ._admission import Ask, Size, count, submit
from ._anthropic_schemas import CountTokensRequest, MessagesRequest
from ._anthropic_stream import MessageShape, MessagesSSEResponse
from ._client import SessionHeader, peer_socket
from ._sse import gather
from ._state import ERRORS, state


def _ask(
    body: MessagesRequest | CountTokensRequest, to_request: Callable[[], RuntimeRequest]
) -> Ask:
    size = Size(len(body.messages), body.text_chars())
    budget = body.max_tokens if isinstance(body, MessagesRequest) else None
    return Ask(body.model, size, to_request, "messages", budget)


async def _create(request: Request, body: MessagesRequest, session: str | None) -> Response:
    """Submitted (api/_admission.py), then replied, streamed or whole."""
    st = state(request)
    submitted = await submit(st, _ask(body, lambda: body.to_request(session)))
    shape = MessageShape(submitted.model, tools=submitted.request.uses_tools)
    if body.stream:
        return MessagesSSEResponse(
            submitted.stream,
            shape,
            st.limiter,
            on_done=st.metrics.observe,
            send_timeout=st.settings.send_timeout,
            sock=peer_socket(request),
        )
    reply = await gather(request, submitted.stream, st.limiter)
    st.metrics.observe(reply.report)
    return JSONResponse(shape.whole(reply.text, reply.report, reply.turn))


async def _count(request: Request, body: CountTokensRequest) -> dict[str, Any]:
    """The whole conversation's prompt tokens, checked as a Messages request is; it
    queues nothing, so it is never refused as busy."""
    return {"input_tokens": await count(state(request), _ask(body, body.to_request))}


def build_router() -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["anthropic"])

    @router.post("/messages", responses=ERRORS)
    async def messages(
        body: MessagesRequest, request: Request, x_warmstart_session: SessionHeader = None
    ) -> Response:
        """An Anthropic Messages reply, whole or streamed (SSE events), with usage
        (cache_read_input_tokens from warmstart's cache) and x_warmstart."""
        return await _create(request, body, x_warmstart_session)

    @router.post("/messages/count_tokens", responses=ERRORS)
    async def count_tokens(body: CountTokensRequest, request: Request) -> JSONResponse:
        """The prompt tokens a Messages request with this conversation would have."""
        return JSONResponse(await _count(request, body))

    return router
