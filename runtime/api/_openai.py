"""The OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions."""

from __future__ import annotations

import socket
from typing import Annotated, Any, Literal

import anyio.to_thread
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response
from pydantic import AfterValidator

from ..errors import ContextOverflow
from ..models import OWNER
from ..serving import check_request
from ..types import Stream
from ._admission import admit_sized
from ._errors import APIError, from_runtime
from ._listing import ServedModel, served_models
from ._replies import Shape
from ._schemas import ChatCompletionRequest, CompletionRequest, safe_session_id
from ._sse import SSEResponse, gather
from ._state import ERRORS, MODEL_ALIASES, AppState, state

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


def _card(st: AppState, model: ServedModel) -> dict[str, Any]:
    """A model's card: OpenAI's fields, then what its GGUF header says (null where it
    is silent), the context warmstart serves it with (once loaded here) and whether
    it is loaded now."""
    info = model.info
    train = info.context_length if info else None
    return {
        "id": model.name,
        "object": "model",
        "created": int(info.modified) if info else st.started,
        "owned_by": info.owned_by if info else OWNER,
        "loaded": model.loaded,
        "aliases": sorted(MODEL_ALIASES) if model.loaded else [],
        "context_length": model.n_ctx or train,  # what a chat gets (trained length until loaded)
        "n_ctx": model.n_ctx,
        "n_ctx_train": train,
        "parameters": info.parameters if info else None,
        "quantization": info.quantization if info else None,
        "architecture": info.architecture if info else None,
        "size_bytes": info.size_bytes if info else None,
    }


def _cards(st: AppState) -> list[dict[str, Any]]:
    """The loaded model first, then every other installed one (no loading)."""
    return [_card(st, model) for model in served_models(st)]


async def _reply(
    request: Request,
    st: AppState,
    events: Stream,
    shape: Shape,
    stream: bool,
    usage: bool,
) -> Response:
    """Returns the generation streamed or whole."""
    if stream:
        return SSEResponse(
            events,
            shape,
            st.limiter,
            include_usage=usage,
            on_done=st.metrics.observe,
            send_timeout=st.settings.send_timeout,
            sock=_peer_socket(request),
        )
    reply = await gather(request, events, st.limiter)
    st.metrics.observe(reply.report)
    return JSONResponse(shape.whole(reply.text, reply.report, reply.turn, reply.logprobs))


def _peer_socket(request: Request) -> socket.socket | None:
    """The client's socket, when the server is warmstart's own (not a test client)."""
    sockets = getattr(request.app.state, "peer_sockets", None)
    client = request.scope.get("client")
    return sockets.get(tuple(client)[:2]) if sockets is not None and client else None


def _check_size(st: AppState, body: ChatCompletionRequest | CompletionRequest) -> None:
    """Refuses, before any tokenizing, a request bigger than the settings allow."""
    limits = st.settings
    if isinstance(body, ChatCompletionRequest):
        if len(body.messages) > limits.max_messages:
            raise APIError(
                400,
                f"messages: {len(body.messages)} messages; at most {limits.max_messages} "
                "are accepted (max_messages)",
                param="messages",
                code="too_many_messages",
            )
        chars, param = body.text_chars(), "messages"
    else:
        chars, param = body.text_chars(), "prompt"
    if chars > limits.max_prompt_chars:
        raise APIError(
            400,
            f"{param}: {chars} characters of text; at most {limits.max_prompt_chars} are "
            "accepted (max_prompt_chars)",
            param=param,
            code="prompt_too_long",
        )


async def _answer(
    request: Request,
    body: ChatCompletionRequest | CompletionRequest,
    session: str | None,
    kind: Literal["chat", "completion"],
) -> Response:
    """Both routes: check the size, take the named model (switching to it when
    another is loaded), size max_tokens, start the generation (errors surface here,
    before any byte is sent), then reply."""
    st = state(request)
    st.check_model(body.model)  # a 404 before any waiting
    _check_size(st, body)
    draft = body.to_request(session, 1)
    check_request(draft)  # a bad value is refused before any model is switched to
    runtime, name = await anyio.to_thread.run_sync(st.acquire, body.model, limiter=st.limiter)
    try:
        admitted = await admit_sized(st, runtime, body.requested_max_tokens(), draft)
        events = await anyio.to_thread.run_sync(runtime.generate, admitted, limiter=st.limiter)
    except ContextOverflow as exc:  # name the field that holds the prompt on this route
        raise from_runtime(exc, "messages" if kind == "chat" else "prompt") from exc
    finally:
        st.release()  # submitted (or refused): a switch may close this runtime now
    shape = Shape(
        kind,
        name,
        tools=draft.uses_tools,
        logprobs=draft.sampling.logprobs is not None,
        prompt_chars=len(draft.prompt or ""),
    )
    return await _reply(request, st, events, shape, body.stream, body.include_usage)


def build_router() -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["openai"])

    @router.get("/models")
    def list_models(request: Request) -> dict[str, Any]:
        """Every installed model, the loaded one first ("default" is its alias), with
        its metadata; a request naming another one loads it."""
        return {"object": "list", "data": _cards(state(request))}

    @router.get("/models/{model_id}", responses=ERRORS)
    def get_model(model_id: str, request: Request) -> dict[str, Any]:
        st = state(request)
        st.check_model(model_id)
        name = st.model_name if model_id in MODEL_ALIASES else model_id
        return next(card for card in _cards(st) if card["id"] == name)

    @router.post("/chat/completions", responses=ERRORS)
    async def chat_completions(
        body: ChatCompletionRequest, request: Request, x_warmstart_session: SessionHeader = None
    ) -> Response:
        """A chat reply, whole or streamed (SSE), with usage and x_warmstart."""
        return await _answer(request, body, x_warmstart_session, "chat")

    @router.post("/completions", responses=ERRORS)
    async def completions(
        body: CompletionRequest, request: Request, x_warmstart_session: SessionHeader = None
    ) -> Response:
        """A raw text completion of ``prompt`` (no chat template), whole or streamed."""
        return await _answer(request, body, x_warmstart_session, "completion")

    return router
