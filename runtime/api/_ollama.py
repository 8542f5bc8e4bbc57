"""The Ollama dialect on the same port: /api/chat, /api/generate, /api/embed,
/api/tags, /api/show, /api/ps, /api/version.

The same runtime serves it, so a conversation sent here finds the cache that the
OpenAI routes filled, and the same middleware guards it (API key, Host and Origin,
body size). Replies carry Ollama's fields and warmstart's cache report.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..errors import ContextOverflow
from ..serving import Admitted, Runtime, check_request, check_sampling
from ..types import Report
from ..types import Request as RuntimeRequest
from . import _embeddings
from . import _ollama_manage as manage
from . import _ollama_models as models
from ._admission import admit_sized
from ._errors import APIError, from_runtime
from ._ollama_schemas import (
    OllamaChatRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaShowRequest,
)
from ._ollama_stream import NDJSONResponse, OllamaShape, now
from ._openai import SessionHeader, _peer_socket
from ._sse import gather
from ._state import ERRORS, AppState, state

# The Ollama release whose API this dialect follows; clients check it for features.
OLLAMA_API_VERSION = "0.12.0"
# How long /api/ps says the model stays loaded when no keep_alive set a time: until a
# switch to another model a request names.
_FOREVER_S = 10 * 365 * 24 * 3600


def _check_model(st: AppState, name: str) -> None:
    st.check_model(models.untagged(name) or None)


def _check_size(st: AppState, n_messages: int, chars: int, param: str) -> None:
    limits = st.settings
    if n_messages > limits.max_messages:
        message = f"messages: {n_messages} messages; at most {limits.max_messages} are accepted"
        raise APIError(400, message, param="messages", code="too_many_messages")
    if chars > limits.max_prompt_chars:
        message = f"{param}: {chars} characters; at most {limits.max_prompt_chars} are accepted"
        raise APIError(400, message, param=param, code="prompt_too_long")


async def _admitted(
    st: AppState, runtime: Runtime, num_predict: int | None, draft: RuntimeRequest
) -> Admitted:
    """Admitted with num_predict, else as many as fit: all the room for -1 and -2
    (Ollama's "until done" and "fill the context"), at most DEFAULT_MAX_TOKENS when
    not given."""
    n_ctx = runtime.n_ctx
    if num_predict is not None and num_predict > n_ctx:
        message = f"num_predict is {num_predict}, but the context holds only {n_ctx} tokens"
        raise APIError(400, message, param="options.num_predict")
    if num_predict == 0:
        raise APIError(400, "num_predict must not be 0", param="options.num_predict")
    given = num_predict if num_predict is not None and num_predict > 0 else None
    return await admit_sized(st, runtime, given, draft, fill=num_predict is not None)


async def _generate(
    request: Request,
    body: OllamaChatRequest | OllamaGenerateRequest,
    session: str | None,
    kind: Literal["chat", "generate"],
) -> Response:
    st = state(request)
    _check_model(st, body.model)
    if isinstance(body, OllamaChatRequest):
        empty, param = not body.messages, "messages"
        _check_size(st, len(body.messages), body.text_chars(), param)
    else:
        empty, param = not body.prompt, "prompt"
        _check_size(st, 1, body.text_chars(), param)
    draft = body.to_request(session, 1)  # refuses what is unsupported before any work
    # a bad value is refused before any model is switched to
    if empty:  # Ollama's "load": no prompt, its options still checked
        check_sampling(draft.sampling)
    else:
        check_request(draft)
    keep = manage.check_keep_alive(st, body.keep_alive_s)
    # the named model, loaded first when another one is (as Ollama does)
    wanted = models.untagged(body.model) or None
    runtime, name = await anyio.to_thread.run_sync(st.acquire, wanted, limiter=st.limiter)
    shape = OllamaShape(kind, models.tag_name(name), tools=draft.uses_tools)
    stream = None
    try:
        if not empty:
            admitted = await _admitted(st, runtime, body.num_predict, draft)
            stream = await anyio.to_thread.run_sync(runtime.generate, admitted, limiter=st.limiter)
    except ContextOverflow as exc:
        raise from_runtime(exc, param) from exc
    finally:
        st.release()  # submitted (or refused): a switch may close this runtime now
    if stream is None:  # Ollama's way to load a model (or, with keep_alive 0, unload it)
        manage.after_reply(st, keep)
        return JSONResponse(shape.loaded("unload" if keep == 0 else "load"))

    def done(report: Report) -> None:
        st.metrics.observe(report)
        manage.after_reply(st, keep)

    if body.stream:
        return NDJSONResponse(
            stream,
            shape,
            st.limiter,
            on_done=done,
            send_timeout=st.settings.send_timeout,
            sock=_peer_socket(request),
        )
    reply = await gather(request, stream, st.limiter)
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
