"""warmstart's own routes: sessions, prewarm, stats, settings, models, /health, /metrics.

The runtime calls here may wait on the runtime's locks (and on a model switch, which
never closes a runtime in use), so these routes are plain ``def`` functions, which
FastAPI runs in its thread pool.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse, Response

from ..serving import SESSION_ID_RULE, Runtime, check_request, session_id_problem
from ..types import Draft, SessionInfo
from ._admission import Size, check_size, for_caller
from ._errors import APIError
from ._metrics import CONTENT_TYPE
from ._middleware import caller_of
from ._openai import SessionHeader
from ._replies import message_json
from ._schemas import ChatCompletionRequest, LoadModelRequest, SessionImport, SessionPatch
from ._state import ERRORS, state

# Settings whose values never leave the server.
_SECRET = frozenset({"api_key"})


def cached_tokens(tiers: dict[str, int]) -> int:
    """The conversation's tokens held in any tier, each counted once.

    The tiers overlap: a token live in the context is usually also in RAM or on disk,
    while a stored chunk is counted in one of "ram" and "disk" only. So the cached
    prefix is the longer of the live one and the stored one, never their sum."""
    return max(tiers.get("live", 0), tiers.get("ram", 0) + tiers.get("disk", 0))


def _session(info: SessionInfo, *, messages: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": info.id,
        "object": "warmstart.session",
        "title": info.title,
        "created": info.created,
        "updated": info.updated,
        "n_tokens": info.n_tokens,
        "cached_tokens": cached_tokens(info.tiers),
        "tiers": info.tiers,
        "location": info.location,
        "anonymous": info.anonymous,
    }
    if messages:
        body["last_divergence"] = info.divergence
        body["messages"] = [
            {**message_json(m), **({"interrupted": True} if m.interrupted else {})}
            for m in info.messages
        ]
    return body


def draft_json(draft: Draft) -> dict[str, Any]:
    return {
        "object": "warmstart.draft",
        "session_id": draft.session_id,
        "state": draft.state,
        "prompt_tokens": draft.prompt_tokens,
        "certain_tokens": draft.certain,
        "ready_tokens": draft.ready,
        "cached_tokens": draft.cached,
        "ms": round(draft.ms, 1),
    }


def _owner(request: Request) -> str:
    """Whose conversations the request may see: its caller's (runtime/users.py)."""
    return caller_of(request.state).owner


def _known(runtime: Runtime, session_id: str, owner: str) -> SessionInfo:
    """``owner``'s stored session of this id, whatever its name: sessions stored before
    the rule on ids (with a '/' or '..') are read, renamed and deleted like any other.
    An unknown id that breaks the rule is a 400 that says why, not a plain 404; another
    user's is a 404, as an unknown one (a 403 would confirm that it exists)."""
    info = runtime.session(session_id, owner)
    if info is not None:
        return info
    problem = session_id_problem(session_id)
    shown = session_id if len(session_id) <= 64 else session_id[:61] + "..."
    if problem is not None:
        message = f"session id {shown!r} {problem}; {SESSION_ID_RULE}"
        raise APIError(400, message, param="session_id", code="invalid_session_id")
    raise APIError(404, f"no session {shown!r}", param="session_id", code="session_not_found")


def build_router() -> APIRouter:
    # Session routes take the rest of the path as the id ({session_id:path}): an id
    # stored with a '/' in it (percent-encoded in the URL) still names one session.
    router = APIRouter(prefix="/v1/warmstart", tags=["warmstart"])
    _add_session_reads(router)
    _add_session_changes(router)
    _add_runtime_routes(router)
    _add_draft_route(router)
    return router


def _add_draft_route(router: APIRouter) -> None:
    @router.post("/prefill", responses=ERRORS)
    def prefill(
        body: ChatCompletionRequest, request: Request, x_warmstart_session: SessionHeader = None
    ) -> dict[str, Any]:
        """A draft: the chat as it stands while its last user message is still being
        typed (or, without one, the conversation the user just opened). The part its
        final version is certain to share is computed in the background, in the
        batches that version's cold run uses, and the answer says how many tokens are
        ready once it stops: done, superseded by a newer draft of the conversation,
        or yielded to a request. Nothing is generated or stored as a turn."""
        st = state(request)
        st.check_model(body.model)
        check_size(st, Size(len(body.messages), body.text_chars()), "messages")
        draft = for_caller(body.to_request(x_warmstart_session, 1))
        check_request(draft)
        with st.using(body.model) as runtime:
            return draft_json(runtime.prefill_draft(draft))


def _add_session_reads(router: APIRouter) -> None:
    @router.get("/sessions")
    def list_sessions(
        request: Request,
        q: Annotated[str, Query(max_length=200)] = "",
        everything: Annotated[bool, Query(alias="all")] = False,
    ) -> dict[str, Any]:
        """Known conversations, newest first, with their cached tokens per tier; ``q``
        keeps those whose title or messages contain it. Those of requests that named no
        session (neither X-Warmstart-Session nor ``user``) are listed with ``all=1``."""
        with state(request).using() as runtime:
            infos = runtime.sessions(q, anonymous=everything, owner=_owner(request))
        return {"object": "list", "data": [_session(i, messages=False) for i in infos]}

    @router.get("/sessions/{session_id:path}", responses=ERRORS)
    def get_session(session_id: str, request: Request) -> dict[str, Any]:
        """One conversation, with its messages."""
        with state(request).using() as runtime:
            return _session(_known(runtime, session_id, _owner(request)), messages=True)


def _add_session_changes(router: APIRouter) -> None:
    """Deleting, renaming and importing conversations, and promoting their KV to RAM."""

    @router.delete("/sessions/{session_id:path}", responses=ERRORS)
    def delete_session(session_id: str, request: Request) -> dict[str, Any]:
        """Forgets a conversation and drops the chunks no other conversation uses."""
        owner = _owner(request)
        with state(request).using() as runtime:
            if not runtime.delete_session(session_id, owner):
                _known(runtime, session_id, owner)  # raises the 404
        return {"id": session_id, "object": "warmstart.session.deleted", "deleted": True}

    @router.patch("/sessions/{session_id:path}", responses=ERRORS)
    def patch_session(session_id: str, body: SessionPatch, request: Request) -> dict[str, Any]:
        """Renames a conversation; its later turns keep the new title."""
        owner = _owner(request)
        with state(request).using() as runtime:
            if not runtime.rename_session(session_id, body.title.strip() or body.title, owner):
                _known(runtime, session_id, owner)  # raises the 404
            return _session(_known(runtime, session_id, owner), messages=False)

    @router.post("/sessions/import", responses=ERRORS)
    def import_sessions(body: SessionImport, request: Request) -> dict[str, Any]:
        """Adds conversations a client kept itself (the app's database before the server
        kept them all), ids and messages as given, without KV. An id already known is
        left unchanged, so an import that was cut short can simply be sent again."""
        added: list[str] = []
        existing: list[str] = []
        with state(request).using() as runtime:
            infos = [kept.to_info() for kept in body.sessions]
            fresh = runtime.import_sessions(infos, _owner(request))
        for kept, new in zip(body.sessions, fresh, strict=True):
            (added if new else existing).append(kept.id)
        return {"object": "warmstart.sessions.imported", "imported": added, "existing": existing}

    @router.post("/sessions/{session_id:path}/prewarm", responses=ERRORS)
    def prewarm_session(session_id: str, request: Request) -> dict[str, Any]:
        """Promotes a conversation's cached chunks to RAM before it is needed."""
        owner = _owner(request)
        with state(request).using() as runtime:
            _known(runtime, session_id, owner)
            promoted = runtime.prewarm(session_id, owner=owner)
            info = _known(runtime, session_id, owner)
        return {
            "session_id": session_id,
            "promoted_tokens": promoted,
            "session": _session(info, messages=False),
        }


def _add_runtime_routes(router: APIRouter) -> None:
    """The runtime itself: its model, its counters, its cache and its settings."""

    @router.post("/models/load", responses=ERRORS)
    def load_model(body: LoadModelRequest, request: Request) -> dict[str, Any]:
        """Switches to an installed model (as a request naming it would) and answers
        once it is loaded; 404 model_not_found for a name no installed model has."""
        st = state(request)
        load_ms = st.load(body.model)
        return {"model": st.model_name, "loaded": True, "load_ms": round(load_ms, 1)}

    @router.get("/stats")
    def stats(request: Request) -> dict[str, Any]:
        """The runtime's counters and tier usage (runtime.stats())."""
        with state(request).using() as runtime:
            return runtime.stats()

    @router.post("/cache/clear")
    def clear_cache(request: Request) -> dict[str, Any]:
        """Empties the KV cache (RAM and disk; a damaged disk cache is reset). The
        conversations stay listed; their next turn is computed again."""
        with state(request).using() as runtime:
            runtime.clear_cache()
        return {"object": "warmstart.cache.cleared", "cleared": True}

    @router.get("/settings")
    def settings(request: Request) -> dict[str, Any]:
        """The effective settings, each ``{"value", "reason"}``; secrets are redacted."""
        with state(request).using() as runtime:
            report = runtime.settings_report()
        return {
            name: (
                {"value": "<redacted>", "reason": entry.get("reason", "")}
                if name in _SECRET
                else entry
            )
            for name, entry in report.items()
        }


def build_service_router() -> APIRouter:
    router = APIRouter(tags=["service"])

    @router.get("/", response_class=PlainTextResponse)
    def root() -> str:
        """A short status, open like /health: front ends made for Ollama probe ``/``
        (which answers "Ollama is running") before they use the API."""
        return "warmstart is running"

    # HEAD apart and out of the schema: one route with both methods gives the OpenAPI
    # document two operations of the same id (a warning, an error in the tests)
    router.add_api_route(
        "/", root, methods=["HEAD"], response_class=PlainTextResponse, include_in_schema=False
    )

    @router.get("/health")
    def health(request: Request) -> dict[str, Any]:
        """Liveness; open without an API key. ``degraded`` names what runs in a reduced
        mode (the disk tier off: replies go on from RAM), and why."""
        st = state(request)
        out: dict[str, Any] = {"status": "ok", "model": st.model_name}
        if st.loading is not None:  # requests wait for the switch; they are not refused
            out["loading"] = st.loading
        degraded = st.runtime.degraded()
        if degraded:
            out["degraded"] = degraded
        return out

    @router.get("/metrics", response_class=Response)
    def metrics(request: Request) -> Response:
        """Prometheus text exposition."""
        return Response(state(request).metrics.render(), media_type=CONTENT_TYPE)

    return router
