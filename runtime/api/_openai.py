"""The OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..models import OWNER
from ._admission import Ask, Size, submit
from ._client import SessionHeader, peer_socket
from ._listing import ServedModel, served_models
from ._replies import Shape
from ._schemas import ChatCompletionRequest, CompletionRequest
from ._sse import SSEResponse, gather
from ._state import ERRORS, MODEL_ALIASES, AppState, state


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


async def _answer(
    request: Request,
    body: ChatCompletionRequest | CompletionRequest,
    session: str | None,
    kind: Literal["chat", "completion"],
) -> Response:
    """Both routes: submitted (api/_admission.py), then replied, streamed or whole."""
    st = state(request)
    if isinstance(body, ChatCompletionRequest):
        size, param = Size(len(body.messages), body.text_chars()), "messages"
    else:
        size, param = Size(0, body.text_chars()), "prompt"
    to_request = lambda: body.to_request(session, 1)  # noqa: E731
    ask = Ask(body.model, size, to_request, param, body.requested_max_tokens())
    submitted = await submit(st, ask)
    draft, events = submitted.request, submitted.stream
    shape = Shape(
        kind,
        submitted.model,
        tools=draft.uses_tools,
        logprobs=draft.sampling.logprobs is not None,
        prompt_chars=len(draft.prompt or ""),
    )
    if body.stream:
        return SSEResponse(
            events,
            shape,
            st.limiter,
            include_usage=body.include_usage,
            on_done=st.metrics.observe,
            send_timeout=st.settings.send_timeout,
            sock=peer_socket(request),
        )
    reply = await gather(request, events, st.limiter)
    st.metrics.observe(reply.report)
    return JSONResponse(shape.whole(reply.text, reply.report, reply.turn, reply.logprobs))


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
