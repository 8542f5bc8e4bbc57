"""/v1/embeddings in OpenAI's shape: one text or a list, floats or base64.

The vectors come from the runtime (the chat model's pooled embeddings, or the
``embedding_model`` setting's GGUF) and have unit length. base64 is what the
official ``openai`` client asks for by default: little-endian float32, decoded by
the client back to floats.

An embeddings request is admitted, limited and cancelled as runtime/_embed_queue.py
says; here a client that disconnects stops its request before the next text, and an
unknown model is a 404 before any work.
"""

from __future__ import annotations

import base64
import logging
import threading
from typing import Annotated, Any, Literal

import anyio
import anyio.to_thread
import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from .._embed_queue import MAX_EMBED_INPUTS
from ..types import Embeddings
from ._errors import APIError, unsupported
from ._schemas import Text
from ._state import ERRORS, AppState, state

log = logging.getLogger(__name__)
MAX_INPUTS = MAX_EMBED_INPUTS


class EmbeddingRequest(BaseModel):
    # "allow" so that a field warmstart does not implement is refused by name
    model_config = ConfigDict(strict=True, extra="allow")

    model: Text | None = Field(None, description="the loaded model's id or 'default'")
    input: Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_INPUTS)] = Field(
        ..., description="a text or a list of texts (token arrays are not accepted)"
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="refused: the model's own size only")
    user: Text | None = None

    def texts(self) -> list[str]:
        for name in self.model_extra or {}:
            raise unsupported(name)
        if self.dimensions is not None:
            raise unsupported("dimensions", "vectors have the model's own size")
        return [self.input] if isinstance(self.input, str) else list(self.input)


def _encode(vector: tuple[float, ...], encoding: str) -> list[float] | str:
    if encoding == "float":
        return list(vector)
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def _wanted(st: AppState, model: str | None) -> str | None:
    """The model to switch to (None: the loaded one); the configured embedding model
    is served by the loaded runtime. A 404 for any other unknown name, before any work."""
    if model is not None and model == st.runtime.embedding_model_id:
        return None
    return st.wanted(model)


async def embed(request: Request, model: str | None, texts: list[str]) -> Embeddings:
    """The runtime's embeddings of ``texts``; ``model`` may name the chat model (or an
    alias), another installed model (switched to, as a chat request does) or the
    configured embedding model. A client that leaves stops the computation."""
    st = state(request)
    chars = sum(len(t) for t in texts)
    if chars > st.settings.max_prompt_chars:
        message = f"input: {chars} characters; at most {st.settings.max_prompt_chars}"
        raise APIError(400, message, param="input", code="prompt_too_long")
    name = _wanted(st, model)
    stop = threading.Event()

    def run() -> Embeddings:
        with st.using(name) as runtime:
            return runtime.embed(texts, stop)

    outcome: Embeddings | Exception | None = None
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_stop_when_gone, request, stop)
            try:
                outcome = await anyio.to_thread.run_sync(
                    run, abandon_on_cancel=True, limiter=st.limiter
                )
            except Exception as exc:  # re-raised below, not wrapped in an ExceptionGroup
                outcome = exc
            group.cancel_scope.cancel()
    finally:
        stop.set()  # cancelled from outside (the server stopping): the thread stops too
    if isinstance(outcome, Exception):
        raise outcome
    assert outcome is not None
    return outcome


async def _stop_when_gone(request: Request, stop: threading.Event) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    log.info("client disconnected; cancelling its embeddings")
    stop.set()


def build_router() -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["openai"])

    @router.post("/embeddings", responses=ERRORS)
    async def embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
        """Unit-length embeddings of one text or a list of texts."""
        result = await embed(request, body.model, body.texts())
        data = [
            {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
            for i, v in enumerate(result.vectors)
        ]
        usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
        return {"object": "list", "data": data, "model": result.model, "usage": usage}

    return router
