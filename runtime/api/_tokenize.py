"""llama-server's /tokenize and /detokenize, for clients that count tokens before
they send: the loaded model's own tokenizer, in llama-server's shapes.

``POST /tokenize {"content", "add_special", "parse_special", "with_pieces"}`` ->
``{"tokens": [ids]}``, or with pieces ``{"tokens": [{"id", "piece"}]}`` where a
piece is its text, or its bytes as a list of numbers when they are not UTF-8 on
their own (a part of a multi-byte character). ``POST /detokenize {"tokens"}`` ->
``{"content"}``.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Request
from pydantic import Field

from ._errors import APIError
from ._schemas import Text, _Body
from ._state import ERRORS, AppState, state

TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


class TokenizeRequest(_Body):
    content: Text = Field(..., description="the text to tokenize")
    add_special: bool = Field(False, description="add the BOS/EOS tokens the model adds")
    parse_special: bool = Field(True, description="read control tokens written in the text")
    with_pieces: bool = Field(False, description="each token with its piece of text")


class DetokenizeRequest(_Body):
    tokens: Annotated[list[TokenId], Field(max_length=1_000_000)] = Field(
        ..., description="token ids of the loaded model"
    )


def _piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _tokenize(st: AppState, body: TokenizeRequest) -> dict[str, Any]:
    limit = st.settings.max_prompt_chars
    if len(body.content) > limit:
        message = f"content: {len(body.content)} characters; at most {limit} are accepted"
        raise APIError(400, message, param="content", code="prompt_too_long")
    with st.using() as runtime:
        ids = runtime.tokenize(body.content, body.add_special, body.parse_special)
        if not body.with_pieces:
            return {"tokens": ids}
        pieces = runtime.pieces(ids)
    return {"tokens": [{"id": i, "piece": _piece(p)} for i, p in zip(ids, pieces, strict=True)]}


def _detokenize(st: AppState, body: DetokenizeRequest) -> dict[str, Any]:
    with st.using() as runtime:
        raw = b"".join(runtime.pieces(body.tokens))
    return {"content": raw.decode("utf-8", "replace")}


def build_router() -> APIRouter:
    router = APIRouter(tags=["llama.cpp"])

    @router.post("/tokenize", responses=ERRORS)
    async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
        """The loaded model's token ids of ``content`` (with their pieces if asked)."""
        st = state(request)
        return await anyio.to_thread.run_sync(_tokenize, st, body, limiter=st.limiter)

    @router.post("/detokenize", responses=ERRORS)
    async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
        """The text of the loaded model's token ids."""
        st = state(request)
        return await anyio.to_thread.run_sync(_detokenize, st, body, limiter=st.limiter)

    return router
