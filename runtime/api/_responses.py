"""The OpenAI Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE
/v1/responses/{id}``.

A response is a chat turn on the same runtime as /v1/chat/completions. One stored
(``store``, the default) is kept in the session store with the conversation through
its output, so a request naming it in ``previous_response_id`` continues that
conversation: the same session id (when the client named one) and the same turns,
hence the same prompt prefix, restored from the KV cache instead of recomputed.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse, Response
from pydantic import AfterValidator

from ..types import Message, Report, StoredResponse
from ._admission import Ask, Size, submit
from ._client import SessionHeader, peer_socket
from ._errors import APIError
from ._middleware import caller_of
from ._responses_schemas import ChosenFunction, DeletedResponse, ResponsesRequest
from ._responses_shape import Events, ResponseShape
from ._responses_stream import ResponseEventsResponse
from ._schemas import _valid_unicode
from ._sse import gather
from ._state import ERRORS, AppState, state

log = logging.getLogger(__name__)

ResponseId = Annotated[str, Path(min_length=1, max_length=256), AfterValidator(_valid_unicode)]


def _not_found(response_id: str, param: str | None = None) -> APIError:
    shown = response_id if len(response_id) <= 64 else response_id[:61] + "..."
    code = "previous_response_not_found" if param else "not_found"
    return APIError(
        404 if param is None else 400, f"no stored response {shown!r}", param=param, code=code
    )


def _echo(body: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as the response object repeats them."""
    choice = body.tool_choice
    fmt = body.text.format if body.text else None
    return {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": dict(body.metadata),
        "parallel_tool_calls": bool(body.parallel_tool_calls),
        "previous_response_id": body.previous_response_id,
        "store": body.store,
        "temperature": body.temperature,
        "text": {"format": fmt.model_dump(by_alias=True) if fmt else {"type": "text"}},
        "tool_choice": choice.model_dump()
        if isinstance(choice, ChosenFunction)
        else choice or "auto",
        "tools": [t.model_dump() for t in body.tools or ()],
        "top_p": body.top_p,
        "truncation": body.truncation,
        "user": body.user,
    }


async def _previous(st: AppState, body: ResponsesRequest, owner: str) -> StoredResponse | None:
    """The response ``previous_response_id`` continues: ``owner``'s only."""
    if body.previous_response_id is None:
        return None
    found = await anyio.to_thread.run_sync(
        st.runtime.response, body.previous_response_id, owner, limiter=st.limiter
    )
    if found is None:
        raise _not_found(body.previous_response_id, "previous_response_id")
    return found


class _Turn:
    """One response being made: its conversation, its session and how it is kept."""

    def __init__(
        self,
        st: AppState,
        body: ResponsesRequest,
        header: str | None,
        previous: StoredResponse | None,
        owner: str,
    ) -> None:
        self.st, self.body, self.owner = st, body, owner
        earlier = previous.messages if previous else ()
        self.history = (*earlier, *body.new_messages(earlier))  # without the instructions
        system = (Message("system", body.instructions),) if body.instructions else ()
        self.messages = (*system, *self.history)
        chained = previous.session_id if previous and previous.named else None
        self.session = header or body.session_hint() or chained

    async def finish(
        self, shape: ResponseShape, text: str, report: Report, reply: Message | None
    ) -> dict[str, Any]:
        """The whole response, kept first when asked (``store`` says whether it was)."""
        out = shape.whole(text, report, reply)
        if self.body.store:
            turn = reply or Message("assistant", text)
            kept = StoredResponse(
                shape.id,
                report.session_id,
                self.session is not None,
                (*self.history, turn),
                out,
            )
            out["store"] = await anyio.to_thread.run_sync(
                self.st.runtime.keep_response, kept, self.owner, limiter=self.st.limiter
            )
            if not out["store"]:
                log.info("response %s not kept: this server keeps no conversation text", shape.id)
        return out


async def _create(request: Request, body: ResponsesRequest, header: str | None) -> Response:
    """The conversation gathered (a stored one continued), submitted
    (api/_admission.py), then replied, streamed or whole."""
    st = state(request)
    st.check_model(body.model)  # a 404 before a stored response is looked up
    owner = caller_of(request.state).owner
    turn = _Turn(st, body, header, await _previous(st, body, owner), owner)
    ask = Ask(
        body.model,
        Size.of(turn.messages),  # the whole conversation, a stored one included
        lambda: body.to_request(turn.messages, turn.session, 1),
        "input",
        body.max_output_tokens,
        "max_output_tokens",
    )
    submitted = await submit(st, ask)
    shape = ResponseShape(submitted.model, _echo(body))

    async def finish(text: str, report: Report, reply: Message | None) -> dict[str, Any]:
        return await turn.finish(shape, text, report, reply)

    if body.stream:
        return ResponseEventsResponse(
            submitted.stream,
            Events(shape),
            st.limiter,
            tools=submitted.request.uses_tools,
            finish=finish,
            on_done=st.metrics.observe,
            send_timeout=st.settings.send_timeout,
            sock=peer_socket(request),
        )
    reply = await gather(request, submitted.stream, st.limiter)
    st.metrics.observe(reply.report)
    return JSONResponse(await finish(reply.text, reply.report, reply.turn))


def build_router() -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["openai"])

    @router.post("/responses", responses=ERRORS)
    async def create_response(
        body: ResponsesRequest, request: Request, x_warmstart_session: SessionHeader = None
    ) -> Response:
        """A response (OpenAI's Responses API), whole or streamed as typed events, with
        usage (cached_tokens: restored from the cache) and x_warmstart."""
        return await _create(request, body, x_warmstart_session)

    @router.get("/responses/{response_id}", responses=ERRORS)
    def get_response(response_id: ResponseId, request: Request) -> dict[str, Any]:
        """A stored response, as it was sent."""
        found = state(request).runtime.response(response_id, caller_of(request.state).owner)
        if found is None:
            raise _not_found(response_id)
        return found.body

    @router.delete("/responses/{response_id}", responses=ERRORS)
    def delete_response(response_id: ResponseId, request: Request) -> DeletedResponse:
        """Forgets a stored response (the conversation it was part of stays)."""
        owner = caller_of(request.state).owner
        if not state(request).runtime.delete_response(response_id, owner):
            raise _not_found(response_id)
        return DeletedResponse(id=response_id)

    return router
