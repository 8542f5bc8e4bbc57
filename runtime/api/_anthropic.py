"""Anthropic's Messages API on the same port: /v1/messages, /v1/messages/count_tokens.

The same runtime serves it, so a conversation here finds the cache and the tool
machinery of /v1/chat/completions, and the same middleware guards it (the API key,
sent as ``x-api-key`` or ``Authorization: Bearer``; Host and Origin; body size).
Replies carry Anthropic's usage with ``cache_read_input_tokens`` and warmstart's
cache report (``x_warmstart``); errors are in Anthropic's shape (_anthropic_stream).
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..errors import ContextOverflow
from ..serving import check_request
from ._admission import admit_sized
from ._anthropic_schemas import CountTokensRequest, MessagesRequest
from ._anthropic_stream import MessageShape, MessagesSSEResponse
from ._errors import APIError, from_runtime
from ._openai import SessionHeader, _peer_socket
from ._sse import gather
from ._state import ERRORS, AppState, state


def _check_size(st: AppState, body: MessagesRequest | CountTokensRequest) -> None:
    """Refuses, before any tokenizing, a request bigger than the settings allow."""
    limits = st.settings
    if len(body.messages) > limits.max_messages:
        message = (
            f"messages: {len(body.messages)} messages; at most {limits.max_messages} "
            "are accepted (max_messages)"
        )
        raise APIError(400, message, param="messages", code="too_many_messages")
    chars = body.text_chars()
    if chars > limits.max_prompt_chars:
        message = (
            f"messages: {chars} characters of text; at most {limits.max_prompt_chars} are "
            "accepted (max_prompt_chars)"
        )
        raise APIError(400, message, param="messages", code="prompt_too_long")


async def _create(request: Request, body: MessagesRequest, session: str | None) -> Response:
    """Check the size, take the named model (switching to it when another is loaded),
    start the generation (errors surface here, before any byte is sent), reply."""
    st = state(request)
    st.check_model(body.model)  # a 404 before any waiting
    _check_size(st, body)
    req = body.to_request(session)  # refuses what is unsupported before any work
    check_request(req)  # a bad value is refused before any model is switched to
    runtime, name = await anyio.to_thread.run_sync(st.acquire, body.model, limiter=st.limiter)
    try:
        admitted = await admit_sized(st, runtime, body.max_tokens, req)  # within the context
        events = await anyio.to_thread.run_sync(runtime.generate, admitted, limiter=st.limiter)
    except ContextOverflow as exc:
        raise from_runtime(exc, "messages") from exc
    finally:
        st.release()  # submitted (or refused): a switch may close this runtime now
    shape = MessageShape(name, tools=req.uses_tools)
    if body.stream:
        return MessagesSSEResponse(
            events,
            shape,
            st.limiter,
            on_done=st.metrics.observe,
            send_timeout=st.settings.send_timeout,
            sock=_peer_socket(request),
        )
    reply = await gather(request, events, st.limiter)
    st.metrics.observe(reply.report)
    return JSONResponse(shape.whole(reply.text, reply.report, reply.turn))


async def _count(request: Request, body: CountTokensRequest) -> dict[str, Any]:
    st = state(request)
    st.check_model(body.model)
    _check_size(st, body)
    req = body.to_request()
    runtime, _ = await anyio.to_thread.run_sync(st.acquire, body.model, limiter=st.limiter)
    try:
        count = await anyio.to_thread.run_sync(runtime.count_tokens, req, limiter=st.limiter)
    finally:
        st.release()
    return {"input_tokens": count}


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
