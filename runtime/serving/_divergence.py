"""Why a prompt was recomputed, pointed at the text (pure).

When a request of a known conversation reuses less than the prompt of its last turn,
the reason is nearly always that its text changed where the user cannot see it: a
clock in the system prompt, tools sent in another order, another model or setting.
:func:`explain` compares the request with that conversation's own last prompt (never
another's: the text shown is the user's own) and names the first place they differ,
a few characters of the old and the new text there, and the known pattern with its
fix. ``Prompts`` keeps each conversation's last prompt in memory (a bounded LRU).
"""

from __future__ import annotations

import collections
import hashlib
import re
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from ..types import Message, Request, Tool
from ._admit import Admitted

if TYPE_CHECKING:
    from ._sessions import SessionBook

SNIPPET = 12  # characters of old and new text shown around the first difference
KEPT = 512  # conversations whose last prompt is kept

_CLOCK = re.compile(
    r"\d{1,2}:\d{2}|\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}/\d{2,4}|"
    r"\b(?:mon|tues|wednes|thurs|fri|satur|sun)day\b|"
    r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.? \d{1,2}\b",
    re.IGNORECASE,
)
_CLOCK_FIX = (
    "the client puts the current time or date into the system prompt, so every "
    "request starts with new text: take it out (Open WebUI: {{CURRENT_DATETIME}}, "
    "{{CURRENT_DATE}} or {{CURRENT_TIME}} in the system prompt; Home Assistant: "
    "{{ now() }} in the prompt template), or give it in the latest user message, "
    "after the part that can be reused"
)


@dataclass(frozen=True)
class Previous:
    """A conversation's last prompt: its messages, its tools, the model fingerprint it
    ran under and its token count."""

    messages: tuple[Message, ...]
    tools: tuple[Tool, ...]
    fingerprint: str | None
    n_tokens: int


@dataclass(frozen=True)
class Divergence:
    """Where a prompt first differs from its conversation's last one. ``where``: the
    system message, message i (role), the tools, or the model; ``offset``: the
    character in that message's text; ``old``/``new``: text around it; ``pattern``
    and ``fix``: a known cause; ``tokens``: what the difference cost (tokens of the
    last prompt computed again)."""

    where: str
    message: int | None
    offset: int | None
    old: str
    new: str
    pattern: str | None
    fix: str | None
    tokens: int

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.text()}

    def text(self) -> str:
        at = self.where if self.offset is None else f"{self.where}, character {self.offset}"
        said = f'{at}: "{self.new}" was "{self.old}"' if self.old or self.new else at
        cost = f"; {self.tokens} tokens recomputed"
        named = f" ({self.pattern}: {self.fix})" if self.pattern else ""
        return said + cost + named


def explain(previous: Previous, request: Request, fingerprint: str, cost: int) -> Divergence | None:
    """The first difference between ``request`` and ``previous`` (see the module
    docstring); None when the request holds the whole previous prompt unchanged."""
    if previous.fingerprint is not None and previous.fingerprint != fingerprint:
        fix = "the cache of another model or setting is never used; its turns are computed again"
        return Divergence(
            "the model or its settings", None, None, "", "", "changed model", fix, cost
        )
    found = _first_message(previous.messages, request.messages, cost)
    if found is not None:
        return found
    return _tools(previous.tools, request.tools, cost)


def _first_message(old: Sequence[Message], new: Sequence[Message], cost: int) -> Divergence | None:
    for i, (was, now) in enumerate(zip(old, new, strict=False)):
        if (was.role, was.content) == (now.role, now.content):
            continue
        where = "system message" if now.role == "system" and i == 0 else f"message {i} ({now.role})"
        if was.role != now.role:
            return Divergence(where, i, None, was.role, now.role, None, None, cost)
        at = _common(was.content, now.content)
        old_text, new_text = _around(was.content, at), _around(now.content, at)
        clock = now.role == "system" and bool(_CLOCK.search(old_text + " " + new_text))
        pattern = "time in the system prompt" if clock else None
        return Divergence(
            where, i, at, old_text, new_text, pattern, _CLOCK_FIX if clock else None, cost
        )
    # a shorter conversation whose messages all stand in the previous one (a question
    # asked again, a regenerate, turns taken back) differs in no text: nothing to show
    return None


def _tools(old: Sequence[Tool], new: Sequence[Tool], cost: int) -> Divergence | None:
    if tuple(old) == tuple(new):
        return None
    was, now = [t.name for t in old], [t.name for t in new]
    if sorted(was) == sorted(now) and set(old) == set(new):
        fix = "send the tools in one fixed order: their definitions come before the conversation"
        return Divergence(
            "tools", None, None, ", ".join(was), ", ".join(now), "tools in another order", fix, cost
        )
    changed = [t.name for t in new if t not in set(old)] + [n for n in was if n not in now]
    fix = "the tools' definitions come before the conversation: changing one recomputes it all"
    return Divergence(
        "tools",
        None,
        None,
        ", ".join(was),
        ", ".join(now),
        f"tools changed ({', '.join(changed)})",
        fix,
        cost,
    )


def _common(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _around(text: str, at: int) -> str:
    """A few characters from the start of the token-ish run that holds ``at``."""
    start = at
    while (
        start > 0
        and at - start < SNIPPET // 2
        and text[start - 1].isalnum() | (text[start - 1] in ":-/")
    ):
        start -= 1
    return text[start : start + SNIPPET].split("\n")[0]


class Prompts:
    """Each conversation's last prompt (see the module docstring), at most KEPT of
    them, the least recent dropped; thread-safe. A conversation is named by its
    owner, its cache scope and its session id; one whose requests name none by its
    opening (the system prompt with its digits masked, and the first user message),
    and then only a difference in its system prompt is explained: any later text
    might be another conversation's that opened the same way."""

    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._last: collections.OrderedDict[tuple[str, ...], Previous] = collections.OrderedDict()
        self._said: dict[tuple[str, ...], Divergence] = {}
        self._lock = threading.Lock()

    def explain(
        self, admitted: Admitted, have: int, fingerprint: str, book: SessionBook | None = None
    ) -> Divergence | None:
        """Why ``admitted`` reused only ``have`` tokens, when its conversation's last
        prompt says (and records it for the session's listing). Without one in memory
        (a restart, a model switch) the ``book``'s record of a named conversation
        stands for it: its messages and the fingerprint its KV was stored under."""
        key = _key(admitted.request, admitted.session_id)
        if key is None:
            return None
        with self._lock:
            previous = self._last.get(key)
        if previous is None and book is not None and admitted.request.session_id is not None:
            row = book.get(admitted.request.session_id, admitted.request.owner)
            if row is not None and row.leaf is not None:
                previous = Previous(row.messages, (), row.fingerprint, row.n_tokens)
                previous = replace(previous, tools=admitted.request.tools)  # (not kept)
        if previous is None:
            return None
        cost = max(0, min(previous.n_tokens, len(admitted.ids)) - have)
        found = explain(previous, admitted.request, fingerprint, cost)
        if found is None or not cost or _edited_question(found, previous):
            return None
        if admitted.request.session_id is None and found.message != 0 and found.offset is not None:
            return None  # (by its opening only: see the class docstring)
        with self._lock:
            self._said[key] = found
        return found

    def remember(self, admitted: Admitted, reply: Message | None, fingerprint: str) -> None:
        """``admitted``'s prompt and ``reply`` as its conversation's last turn."""
        key = _key(admitted.request, admitted.session_id)
        if key is None:
            return
        request = admitted.request
        messages = (*request.messages, *((reply,) if reply is not None else ()))
        previous = Previous(messages, request.tools, fingerprint, len(admitted.ids))
        with self._lock:
            self._last[key] = previous
            self._last.move_to_end(key)
            while len(self._last) > self._kept:
                old, _ = self._last.popitem(last=False)
                self._said.pop(old, None)

    def last_said(self, owner: str, session_id: str) -> Divergence | None:
        """The last divergence explained in this conversation (any cache scope)."""
        with self._lock:
            return next(
                (
                    d
                    for k, d in reversed(self._said.items())
                    if k[0] == owner and k[2] == session_id
                ),
                None,
            )


def _key(request: Request, session_id: str | None) -> tuple[str, ...] | None:
    if request.session_id is not None:
        return (request.owner, request.cache_scope, request.session_id)
    system = [re.sub(r"\d", "#", m.content) for m in request.messages[:1] if m.role == "system"]
    first = [m.content for m in request.messages if m.role == "user"][:1]
    if not first or session_id is None:
        return None
    opening = "\0".join([*system, *first]).encode()
    return (
        request.owner,
        request.cache_scope,
        "~" + hashlib.blake2b(opening, digest_size=8).hexdigest(),
    )


def _edited_question(found: Divergence, previous: Previous) -> bool:
    """The difference is in the last prompt's own last user message: the user edited
    (or asked another) question, which they see, rather than text changing unseen."""
    last_user = max((i for i, m in enumerate(previous.messages) if m.role == "user"), default=-1)
    return found.message == last_user and found.message != 0
