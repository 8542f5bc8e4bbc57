"""/v1/embeddings in OpenAI's shape: one text or a list, floats or base64.

The vectors come from the runtime (the chat model's pooled embeddings, or the
``embedding_model`` setting's GGUF) and have unit length. base64 is what the
official ``openai`` client asks for by default: little-endian float32, decoded by
the client back to floats.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import anyio.to_thread
import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from ..types import Embeddings
from ._errors import APIError, unsupported
from ._schemas import Text
from ._state import ERRORS, AppState, state

MAX_INPUTS = 2048  # OpenAI's limit on one request's list


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


async def embed(st: AppState, model: str | None, texts: list[str]) -> Embeddings:
    """The runtime's embeddings of ``texts``; ``model`` may name the chat model (or an
    alias) or the configured embedding model, which is only known once loaded."""
    chars = sum(len(t) for t in texts)
    if chars > st.settings.max_prompt_chars:
        message = f"input: {chars} characters; at most {st.settings.max_prompt_chars}"
        raise APIError(400, message, param="input", code="prompt_too_long")
    try:
        st.check_model(model)
        known = True
    except APIError:
        known = False

    def run() -> Embeddings:
        # a model name switches to that model first, as a chat request does
        with st.using(model if known else None) as runtime:
            return runtime.embed(texts)

    result = await anyio.to_thread.run_sync(run, limiter=st.limiter)
    if not known and model != result.model:
        st.check_model(model)  # raises the usual 404
    return result


def build_router() -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["openai"])

    @router.post("/embeddings", responses=ERRORS)
    async def embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
        """Unit-length embeddings of one text or a list of texts."""
        result = await embed(state(request), body.model, body.texts())
        data = [
            {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
            for i, v in enumerate(result.vectors)
        ]
        usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
        return {"object": "list", "data": data, "model": result.model, "usage": usage}

    return router
