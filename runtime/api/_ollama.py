"""The Ollama dialect on the same port: /api/chat, /api/generate, /api/embed,
/api/tags, /api/show, /api/ps, /api/version.

The same runtime serves it, so a conversation sent here finds the cache that the
OpenAI routes filled, and the same middleware guards it (API key, Host and Origin,
body size). Replies carry Ollama's fields and warmstart's cache report.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..types import Report
from . import _embeddings
from . import _ollama_manage as manage
from . import _ollama_models as models
from ._admission import Ask, Size, load, submit
from ._client import SessionHeader, peer_socket
from ._errors import APIError
from ._ollama_schemas import (
    OllamaChatRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaShowRequest,
)
from ._ollama_stream import NDJSONResponse, OllamaShape, now
from ._sse import gather
from ._state import ERRORS, AppState, state

# The Ollama release whose API this dialect follows; clients check it for features.
OLLAMA_API_VERSION = "0.12.0"
# How long /api/ps says the model stays loaded when no keep_alive set a time: until a
# switch to another model a request names.
_FOREVER_S = 10 * 365 * 24 * 3600


def _ask(body: OllamaChatRequest | OllamaGenerateRequest, session: str | None) -> tuple[Ask, bool]:
    """The ask of /api/chat or /api/generate, and whether it is Ollama's load (no
    prompt). num_predict -1 and -2 (Ollama's "until done" and "fill the context")
    take all the room; none, at most DEFAULT_MAX_TOKENS."""
    if isinstance(body, OllamaChatRequest):
        empty, param, n_messages = not body.messages, "messages", len(body.messages)
    else:
        empty, param, n_messages = not body.prompt, "prompt", 1
    num_predict = body.num_predict
    if num_predict == 0 and not empty:
        raise APIError(400, "num_predict must not be 0", param="options.num_predict")
    ask = Ask(
        models.untagged(body.model) or None,
        Size(n_messages, body.text_chars()),
        lambda: body.to_request(session, 1),  # refuses what is unsupported before any work
        param,
        num_predict if num_predict is not None and num_predict > 0 else None,
        "options.num_predict",
        fill=num_predict is not None,
    )
    return ask, empty


async def _generate(
    request: Request,
    body: OllamaChatRequest | OllamaGenerateRequest,
    session: str | None,
    kind: Literal["chat", "generate"],
) -> Response:
    """Submitted (api/_admission.py), or only loaded without a prompt, then replied."""
    st = state(request)
    keep = manage.check_keep_alive(st, body.keep_alive_s)
    ask, empty = _ask(body, session)
    if empty:  # Ollama's way to load a model (or, with keep_alive 0, unload it)
        name, draft = await load(st, ask)
        manage.after_reply(st, keep)
        shape = OllamaShape(kind, models.tag_name(name), tools=draft.uses_tools)
        return JSONResponse(shape.loaded("unload" if keep == 0 else "load"))
    submitted = await submit(st, ask)
    shape = OllamaShape(kind, models.tag_name(submitted.model), tools=submitted.request.uses_tools)

    def done(report: Report) -> None:
        st.metrics.observe(report)
        manage.after_reply(st, keep)

    if body.stream:
        return NDJSONResponse(
            submitted.stream,
            shape,
            st.limiter,
            on_done=done,
            send_timeout=st.settings.send_timeout,
            sock=peer_socket(request),
        )
    reply = await gather(request, submitted.stream, st.limiter)
    done(reply.report)
    return JSONResponse(shape.final(reply.text, reply.report, reply.turn if shape.tools else None))


def _show(st: AppState, name: str) -> dict[str, Any]:
    wanted = models.untagged(name)
    for entry in models.installed_models(st):
        if wanted in (models.untagged(entry.name), "default") or not wanted:
            arch = entry.architecture or "unknown"
            return {
                "modelfile": f"# served by warmstart\nFROM {entry.name}\n",
                "parameters": "",
                "template": entry.template,
                "details": models.details(entry),
                "model_info": {
                    "general.architecture": arch,
                    "general.parameter_count": entry.parameters,
                    f"{arch}.context_length": entry.context_length,
                },
                "capabilities": ["completion", "tools", "embedding"],
                "modified_at": models.timestamp(entry.modified),
            }
    raise APIError(404, f"model '{name}' not found", param="model", code="model_not_found")


def _ps(st: AppState) -> dict[str, Any]:
    until = models.timestamp(st.expiry.due or time.time() + _FOREVER_S)
    out = []
    for entry in models.installed_models(st):
        if entry.loaded:
            out.append(
                {
                    **models.tag(entry),
                    "expires_at": until,
                    "size_vram": 0,  # not measured here
                    "context_length": st.runtime.n_ctx,
                }
            )
    return {"models": out}


def build_router() -> APIRouter:
    router = APIRouter(prefix="/api", tags=["ollama"])

    @router.get("/version")
    def version() -> dict[str, Any]:
        """The Ollama API version this dialect follows."""
        return {"version": OLLAMA_API_VERSION}

    @router.get("/tags")
    def tags(request: Request) -> dict[str, Any]:
        """The models this server answers with."""
        return {"models": [models.tag(e) for e in models.installed_models(state(request))]}

    @router.get("/ps")
    def running(request: Request) -> dict[str, Any]:
        """The loaded model, and until when keep_alive keeps it (none once unloaded)."""
        return _ps(state(request))

    @router.post("/show", responses=ERRORS)
    def show(body: OllamaShowRequest, request: Request) -> dict[str, Any]:
        """A model's details, template and context length."""
        body.refuse_extras()
        return _show(state(request), body.wanted)

    @router.post("/chat", responses=ERRORS)
    async def chat(
        body: OllamaChatRequest, request: Request, x_warmstart_session: SessionHeader = None
    ) -> Response:
        """A chat reply, streamed as NDJSON (the default) or whole."""
        return await _generate(request, body, x_warmstart_session, "chat")

    @router.post("/generate", responses=ERRORS)
    async def generate(
        body: OllamaGenerateRequest, request: Request, x_warmstart_session: SessionHeader = None
    ) -> Response:
        """A reply to one prompt (through the chat template unless ``raw``)."""
        return await _generate(request, body, x_warmstart_session, "generate")

    @router.post("/embed", responses=ERRORS)
    async def embed_texts(body: OllamaEmbedRequest, request: Request) -> dict[str, Any]:
        """Normalised embeddings of one text or a list of texts."""
        started = time.monotonic()
        name = models.untagged(body.model) or None
        st = state(request)
        keep = manage.check_keep_alive(st, body.keep_alive_s)
        result = await _embeddings.embed(request, name, body.texts())
        manage.after_reply(st, keep)
        return {
            "model": models.tag_name(result.model),
            "embeddings": [list(v) for v in result.vectors],
            "total_duration": int((time.monotonic() - started) * 1e9),
            "load_duration": 0,
            "prompt_eval_count": result.prompt_tokens,
            "created_at": now(),
        }

    return router
