"""Every generating route's last step before the runtime: the request admitted once
(runtime/serving/_admit.py), with its reply budget sized from the admitted prompt."""

from __future__ import annotations

from dataclasses import replace

import anyio.to_thread

from ..serving import Admitted, Runtime
from ..types import Request
from ._errors import APIError
from ._middleware import CALLER
from ._schemas import DEFAULT_MAX_TOKENS
from ._state import AppState


async def admit_sized(
    st: AppState,
    runtime: Runtime,
    requested: int | None,
    draft: Request,
    param: str = "max_tokens",
    fill: bool = False,
) -> Admitted:
    """``draft`` admitted with the client's max_tokens (the field ``param``), else with
    as many as fit: all the room with ``fill``, at most DEFAULT_MAX_TOKENS without.
    Sized after admission, from its ids: the prompt is tokenized once."""
    n_ctx = runtime.n_ctx
    if requested is not None:
        if requested > n_ctx:
            message = f"{param} is {requested}, but the context holds only {n_ctx} tokens"
            raise APIError(400, message, param=param)
        draft = replace(draft, sampling=replace(draft.sampling, max_tokens=requested))
    else:  # the least budget: the most prompt kept; admission leaves room for one token
        draft = replace(draft, sampling=replace(draft.sampling, max_tokens=1))
    draft = for_caller(draft)
    admitted = await anyio.to_thread.run_sync(runtime.admit, draft, limiter=st.limiter)
    if requested is not None:
        return admitted
    room = n_ctx - len(admitted.ids)
    return admitted.with_max_tokens(room if fill else min(DEFAULT_MAX_TOKENS, room))


def for_caller(draft: Request) -> Request:
    """``draft`` as its caller's (AuthMiddleware's CALLER): the conversation theirs,
    the KV cache of their scope, narrowed by the request's own ``cache_salt`` (which
    the dialect put in ``cache_scope``, vLLM's field) when it gave one."""
    caller = CALLER.get()
    scope = caller.cache_scope
    if draft.cache_scope:
        scope = f"{scope}\0salt:{draft.cache_scope}"
    return replace(draft, owner=caller.owner, cache_scope=scope)
