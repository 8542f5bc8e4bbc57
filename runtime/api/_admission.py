"""Every generating route's one way in, from its JSON to a started generation.

``submit`` does it in this order: the named model checked (a 404 before any
waiting), the request's size bounded before anything is tokenized, the request
built and its values checked (refused before any model is switched to), the runtime
taken (the named model loaded first when another one is), the request admitted
once with its reply budget (runtime/serving/_admit.py sizes it from the prompt), the
generation started (errors surface here, before any byte is sent), the runtime
released, and a prompt over the context named by the route's own field.

The dialects (_openai, _anthropic, _ollama, _responses) read their JSON into an
``Ask`` and shape what comes back; nothing else of a request's way in is theirs.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

import anyio.to_thread

from ..errors import ContextOverflow
from ..serving import Runtime, check_request, check_sampling
from ..types import Budget, Message, Request, Stream
from ._errors import APIError, from_runtime
from ._middleware import CALLER
from ._schemas import DEFAULT_MAX_TOKENS
from ._state import AppState


@dataclass(frozen=True)
class Size:
    """A request's size as its JSON gave it: messages, and characters of text (the
    messages', their tool calls' and the tools' schemas)."""

    messages: int
    chars: int

    @classmethod
    def of(cls, messages: tuple[Message, ...]) -> Size:
        chars = sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in messages)
        return cls(len(messages), chars)


@dataclass(frozen=True)
class Ask:
    """What a dialect asks of the runtime, its JSON read.

    ``model``: the name the client gave (None: the loaded model); ``to_request``:
    builds the runtime's request (refusing what is unsupported), called once the
    size passed; ``prompt_param``: the field that holds the prompt, which size and
    overflow errors name; ``max_tokens``: the client's reply budget, in the field
    ``budget_param`` (None: as many as fit, all the room with ``fill``, else at most
    DEFAULT_MAX_TOKENS)."""

    model: str | None
    size: Size
    to_request: Callable[[], Request]
    prompt_param: str
    max_tokens: int | None = None
    budget_param: str = "max_tokens"
    fill: bool = False


@dataclass(frozen=True)
class Submitted:
    """A started generation, the name of the model that runs it and the request as
    built (what the reply's shape needs of it)."""

    stream: Stream
    model: str
    request: Request


def check_size(st: AppState, size: Size, param: str) -> None:
    """Refuses, before any tokenizing, a request bigger than the settings allow."""
    limits = st.settings
    if size.messages > limits.max_messages:
        message = (
            f"{param}: {size.messages} messages; at most {limits.max_messages} are accepted "
            "(max_messages)"
        )
        raise APIError(400, message, param=param, code="too_many_messages")
    if size.chars > limits.max_prompt_chars:
        message = (
            f"{param}: {size.chars} characters of text; at most {limits.max_prompt_chars} are "
            "accepted (max_prompt_chars)"
        )
        raise APIError(400, message, param=param, code="prompt_too_long")


async def submit(st: AppState, ask: Ask) -> Submitted:
    """The way in (see the module docstring)."""
    draft = _checked(st, ask, check_request)
    async with _taken(st, ask.model) as (runtime, name):
        try:
            stream = await _start(st, runtime, draft, ask)
        except ContextOverflow as exc:
            raise from_runtime(exc, ask.prompt_param) from exc
    return Submitted(stream, name, draft)


async def load(st: AppState, ask: Ask) -> tuple[str, Request]:
    """Ollama's load: a request without a prompt takes its model (loading it when
    another one is), its options checked; nothing is generated. Returns the model's
    name and the request as built."""
    draft = _checked(st, ask, lambda r: check_sampling(r.sampling))
    async with _taken(st, ask.model) as (_, name):
        return name, draft


async def count(st: AppState, ask: Ask) -> int:
    """The prompt's tokens, the request checked as ``submit`` checks it; nothing is
    queued, so it is never refused as busy."""
    draft = _checked(st, ask, check_request)
    async with _taken(st, ask.model) as (runtime, _):
        return await anyio.to_thread.run_sync(runtime.count_tokens, draft, limiter=st.limiter)


def _checked(st: AppState, ask: Ask, check: Callable[[Request], None]) -> Request:
    st.check_model(ask.model)
    check_size(st, ask.size, ask.prompt_param)
    draft = ask.to_request()
    check(draft)
    return draft


@contextlib.asynccontextmanager
async def _taken(st: AppState, model: str | None) -> AsyncIterator[tuple[Runtime, str]]:
    """The runtime (and its name) for ``model``, switched to when another one is
    loaded; released after, so a switch may close it."""
    runtime, name = await anyio.to_thread.run_sync(st.acquire, model, limiter=st.limiter)
    try:
        yield runtime, name
    finally:
        st.release()


async def _start(st: AppState, runtime: Runtime, draft: Request, ask: Ask) -> Stream:
    budget = _budget(ask, runtime.n_ctx)
    mine = for_caller(draft)
    admitted = await anyio.to_thread.run_sync(runtime.admit, mine, budget, limiter=st.limiter)
    return await anyio.to_thread.run_sync(runtime.generate, admitted, limiter=st.limiter)


def _budget(ask: Ask, n_ctx: int) -> Budget:
    requested = ask.max_tokens
    if requested is not None and requested > n_ctx:
        message = f"{ask.budget_param} is {requested}, but the context holds only {n_ctx} tokens"
        raise APIError(400, message, param=ask.budget_param)
    return Budget(requested, None if ask.fill else DEFAULT_MAX_TOKENS)


def for_caller(draft: Request) -> Request:
    """``draft`` as its caller's (AuthMiddleware's CALLER): the conversation theirs,
    the KV cache of their scope, narrowed by the request's own ``cache_salt`` (which
    the dialect put in ``cache_scope``, vLLM's field) when it gave one."""
    caller = CALLER.get()
    scope = caller.cache_scope
    if draft.cache_scope:
        scope = f"{scope}\0salt:{draft.cache_scope}"
    return replace(draft, owner=caller.owner, cache_scope=scope)
