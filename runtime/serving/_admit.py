"""Admission: a request is checked, named, planned, templated, tokenized and fitted
to the context once, here, and the frozen result (``Admitted``) is what runs.

Every rule on a request's values lives in this module (``check_request``): the
HTTP schemas keep only the shape of JSON and defer to it, the runtimes call it, so a
bad value gets the same refusal, naming the same field, on every route and runtime.
What the HTTP API refuses before a request reaches a runtime (its size in messages
and characters, a budget over the context, Ollama's ``num_predict`` of 0) is the
API's own, in runtime/api/_admission.py.

Admission comes in two halves, ``prepare`` (no tokens) and ``fit``, so that a
runtime refuses a request it has no room for (Busy) between them, before a large
prompt is tokenized. A reply budget the client left open (``Budget``) is sized in
``fit``, once, from the prompt's tokens.

The overflow rule, once: a prompt is refused (``ContextOverflow``) only when it
leaves no room for one reply token (``len(ids) >= n_ctx``); a reply that would run
past the context stops there (finish_reason ``length``). With ``overflow="trim"`` a
conversation whose prompt and max_tokens do not fit together first loses its
earliest turns (the system prompt and the latest turns that fit stay). A prompt
that a proven lower bound on its token count already puts over the context is
refused before it is tokenized (``_refuse_unfit``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, get_args

from ..engine import check_choice
from ..errors import ContextOverflow, RequestError
from ..types import Budget, Message, Request, Role, Sampling
from ._sessions import check_session_id, derived_session_id

if TYPE_CHECKING:
    from ..engine import Prompter, ToolPlan

ROLES: tuple[str, ...] = get_args(Role)
MAX_TOP_K = 1_000_000

# (field, lowest, highest, lowest included): what the samplers honour (engine/_sampling.py)
_BOUNDS: tuple[tuple[str, float, float, bool], ...] = (
    ("temperature", 0.0, 2.0, True),
    # 0 would keep no token: llama.cpp's top-p sampler needs a positive mass
    ("top_p", 0.0, 1.0, False),
    ("top_k", 0, MAX_TOP_K, True),
    ("min_p", 0.0, 1.0, True),
    ("repeat_penalty", 0.0, 10.0, False),
    ("frequency_penalty", -2.0, 2.0, True),
    ("presence_penalty", -2.0, 2.0, True),
)


def check_sampling(s: Sampling) -> None:
    """The sampling values warmstart honours; a RequestError naming the field else."""
    if s.max_tokens < 1:
        raise RequestError("max_tokens must be at least 1", param="max_tokens")
    for name, low, high, low_in in _BOUNDS:
        value = getattr(s, name)
        above = value >= low if low_in else value > low
        if not (math.isfinite(value) and above and value <= high):
            span = f"{'[' if low_in else '('}{low:g}, {high:g}]"
            raise RequestError(f"{name} must be in {span}", param=name)


def check_request(request: Request) -> None:
    """The rules of a request that need no model: a prompt or messages (not both),
    known roles, a valid session id, sampling within bounds, a tool choice that
    names one of the tools."""
    if request.prompt is None and not request.messages:
        raise RequestError("messages must not be empty", param="messages")
    if request.prompt is not None and request.messages:
        raise RequestError("give either messages or prompt, not both", param="prompt")
    if request.prompt is not None and not request.prompt:
        raise RequestError("prompt must not be empty", param="prompt")
    for i, message in enumerate(request.messages):
        if message.role not in ROLES:
            known = ", ".join(ROLES)
            raise RequestError(
                f"messages.{i}.role: {message.role!r} is not one of {known}",
                param=f"messages.{i}.role",
            )
    if request.session_id is not None:
        check_session_id(request.session_id)
    check_sampling(request.sampling)
    check_choice(request)


def check_fits(n_prompt: int, max_tokens: int, n_ctx: int, tools: bool = False) -> None:
    """The overflow rule (see the module docstring): room for one reply token."""
    if n_prompt >= n_ctx:
        raise ContextOverflow(n_prompt, max_tokens, n_ctx, tools=tools)


@dataclass(frozen=True)
class Admitted:
    """A request ready to run, as admission left it.

    ``request``: what runs (the tools' grammar in its sampling; with turns left out,
    only those that fit); ``ids``/``anchors``: its prompt tokens and where its turns
    start; ``session_id``: the conversation, named by the client or derived from the
    whole conversation before any trimming; ``tools``: the plan its reply is read
    back with (None without tools); ``history``: the whole conversation when turns
    were left out (``trimmed`` of them), which the session keeps; ``model``: the
    fingerprint of the model that tokenized it (its ids mean nothing to another)."""

    request: Request
    ids: tuple[int, ...]
    anchors: tuple[int, ...]
    session_id: str | None
    tools: ToolPlan | None
    model: str
    history: tuple[Message, ...] | None = None
    trimmed: int = 0

    def with_max_tokens(self, max_tokens: int) -> Admitted:
        """The same admission with another reply budget (``fit`` sizes an open one
        with it). It needs no new trim: the prompt already fits, and the reply stops
        where the context ends."""
        sampling = replace(self.request.sampling, max_tokens=max_tokens)
        check_sampling(sampling)
        return replace(self, request=replace(self.request, sampling=sampling))


@dataclass(frozen=True)
class Prepared:
    """A request checked and planned, not yet tokenized: admission's first half.
    ``budget``: the reply budget sized once the prompt is known (None: the request's
    own max_tokens)."""

    request: Request
    plan: ToolPlan | None
    budget: Budget | None = None


def prepare(request: Request, prompter: Prompter, budget: Budget | None = None) -> Prepared:
    """The checks that need no tokens (the request's values, the tool plan and its
    grammar, the model's own sampling checks): cheap, so a runtime may ask whether
    it has room between this and ``fit``, before a large prompt is tokenized."""
    if budget is not None:
        request = replace(request, sampling=replace(request.sampling, max_tokens=budget.fitting))
    check_request(request)
    plan = prompter.tool_plan(request)
    request = _with_tool_grammar(request, plan)
    if plan is not None:
        plan = replace(plan, request=request)
    prompter.check_sampling(request.sampling)
    return Prepared(request, plan, budget)


def fit(prepared: Prepared, prompter: Prompter, n_ctx: int, overflow: str = "trim") -> Admitted:
    """Names, templates, tokenizes and fits a prepared request (see the module
    docstring), its reply budget sized last."""
    request, plan = prepared.request, prepared.plan
    # named by the whole conversation, before any trimming
    session_id = request.session_id or (
        derived_session_id(request.messages) if request.messages else None
    )
    _refuse_unfit(request, prompter, n_ctx, overflow)
    ids, anchors = prompter.prompt_ids(request, plan=plan)
    # a raw completion prompt is the client's own markup: its reply is not read back
    tools = plan if request.messages else None
    admitted = Admitted(request, tuple(ids), anchors, session_id, tools, prompter.fingerprint)
    if overflow == "trim":
        admitted = _trim(admitted, prompter, n_ctx)
    check_fits(len(admitted.ids), request.sampling.max_tokens, n_ctx, request.uses_tools)
    if prepared.budget is None:
        return admitted
    return admitted.with_max_tokens(prepared.budget.sized(len(admitted.ids), n_ctx))


def admit(
    request: Request,
    prompter: Prompter,
    n_ctx: int,
    overflow: str = "trim",
    budget: Budget | None = None,
) -> Admitted:
    """Checks, plans, templates, tokenizes and fits ``request`` (``prepare`` then
    ``fit``)."""
    return fit(prepare(request, prompter, budget), prompter, n_ctx, overflow)


def prompt_tokens(prepared: Prepared, prompter: Prompter) -> int:
    """The prompt's tokens as templated, the whole conversation (no turn trimmed)."""
    return len(prompter.prompt_ids(prepared.request, plan=prepared.plan)[0])


def _refuse_unfit(request: Request, prompter: Prompter, n_ctx: int, overflow: str) -> None:
    """The overflow rule before any tokenizing, by a proven lower bound on the token
    count: a megabyte of text is refused in milliseconds instead of seconds of a core
    spent tokenizing it. With ``overflow="trim"`` the bound is the least that trimming
    keeps (the system prompt and the last turn, as ``_trim`` falls back to)."""
    kept = _least_kept(request) if overflow == "trim" else request
    least = prompter.least_tokens(kept, n_ctx)
    if least >= n_ctx:
        max_tokens = request.sampling.max_tokens
        raise ContextOverflow(least, max_tokens, n_ctx, at_least=True, tools=request.uses_tools)


def _least_kept(request: Request) -> Request:
    """The conversation as far as trimming may cut it: the system prompt, the last turn."""
    head, starts = _cut_points(request.messages)
    if not starts:
        return request
    messages = request.messages
    return replace(request, messages=messages[:head] + messages[starts[-1] :])


def _cut_points(messages: tuple[Message, ...]) -> tuple[int, list[int]]:
    """How many leading messages trimming keeps (a system prompt), and where each turn
    that the kept part may start with begins (every user message but the first)."""
    head = 1 if messages and messages[0].role == "system" else 0
    return head, [i for i in range(head + 1, len(messages)) if messages[i].role == "user"]


def _with_tool_grammar(request: Request, plan: ToolPlan | None) -> Request:
    """A request whose tools force the reply's shape gets their grammar."""
    grammar = plan.grammar() if plan else None
    if grammar is None:
        return request
    if request.sampling.grammar is not None:
        raise RequestError("a reply format cannot be combined with tools", param="tools")
    return replace(request, sampling=replace(request.sampling, grammar=grammar))


def _trim(admitted: Admitted, prompter: Prompter, n_ctx: int) -> Admitted:
    """A conversation that leaves less than max_tokens of room loses its earliest
    turns: the system prompt and the most recent turns that fit stay (the kept part
    starts at a user turn)."""
    request = admitted.request
    limit = n_ctx - request.sampling.max_tokens
    messages = request.messages
    if not messages or len(admitted.ids) <= limit:
        return admitted
    head, starts = _cut_points(messages)

    def kept(start: int) -> Admitted:
        shorter = replace(request, messages=messages[:head] + messages[start:])
        plan = prompter.tool_plan(shorter)
        ids, anchors = prompter.prompt_ids(shorter, plan=plan)
        return replace(
            admitted,
            request=shorter,
            ids=tuple(ids),
            anchors=anchors,
            tools=plan,
            history=messages,
            trimmed=start - head,
        )

    best: Admitted | None = None
    lo, hi = 0, len(starts) - 1
    while lo <= hi:  # fewer turns, fewer tokens: the earliest start that fits
        mid = (lo + hi) // 2
        candidate = kept(starts[mid])
        if len(candidate.ids) <= limit:
            best, hi = candidate, mid - 1
        else:
            lo = mid + 1
    if best is None and starts:  # nothing leaves max_tokens: keep the last turn only
        best = kept(starts[-1])
    return best or admitted
