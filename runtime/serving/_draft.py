"""Drafts: the prompt a user is still typing, prefilled before Enter.

A draft is a chat request whose last message may still change (the one being
typed), or a conversation as it stands (its next message is still to come). Only
what the final prompt is certain to share is computed, in exactly the batches a
cold run of the final prompt uses (:func:`~runtime.kvstore._batches.aligned_cuts`: the
batch ends every longer prompt has), so the reply after Enter still equals
``--no-cache``: Enter finds those batches live and prefills only the rest.

A draft is background work on the worker: it runs only while no client waits, a
request that arrives stops its decode at once (redone after), the next request of
its conversation ends it, and a newer draft of the same conversation supersedes it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, replace

from ..engine import Prompter, Resident
from ..kvstore import LoadPlan, aligned_cuts, common_prefix, ends_through
from ..types import Draft, DraftState, Message, Request
from ._admit import Admitted
from ._pipeline import Env, Job
from ._schedule import EndNow, Phase
from ._sessions import derived_session_id
from ._streams import QueueStream

log = logging.getLogger(__name__)

# appended to the message being typed: what still follows its text changes only the
# tokens from its last word on (a tokenizer merges within a word, never across the
# pre-tokenizer's splits), so the ids all of these share are the certain ones
_NEXT_TEXT = ("x", " x", "\n", ".")


@dataclass(frozen=True)
class DraftPlan:
    """What a draft computes: ``ids``, the prompt's certain tokens, ending where the
    last of ``cuts`` (the batch ends the final prompt shares) does; ``prompt_tokens``,
    the draft's tokens as it stands; ``typed_from``: where the message being typed
    starts (a request sharing more than that is this conversation's next turn)."""

    ids: tuple[int, ...]
    cuts: tuple[int, ...]
    prompt_tokens: int
    typed_from: int

    @property
    def certain(self) -> int:
        return self.cuts[-1] if self.cuts else 0


def plan_draft(prompter: Prompter, request: Request, chunk_tokens: int, tile: int) -> DraftPlan:
    """The certain part of ``request``'s prompt (see the module docstring)."""
    messages = request.messages
    if messages[-1].role != "user":  # the conversation as it stands: all of it is certain
        ids, anchors = prompter.prompt_ids(request, generation=False)
        # the next message starts here: an anchor of every later prompt
        cuts = aligned_cuts(0, len(ids), chunk_tokens, (*anchors, len(ids)), tile)
        return DraftPlan(tuple(ids), tuple(cuts), len(ids), len(ids))
    ids, anchors = prompter.prompt_ids(request)
    certain = len(ids)
    for more in _NEXT_TEXT:
        typed = replace(messages[-1], content=messages[-1].content + more)
        other, _ = prompter.prompt_ids(replace(request, messages=(*messages[:-1], typed)))
        certain = min(certain, common_prefix(ids, other))
    shared = [a for a in anchors if a <= certain]
    cuts = aligned_cuts(0, certain, chunk_tokens, shared, tile)
    return DraftPlan(tuple(ids), tuple(cuts), len(ids), shared[-1] if shared else 0)


def draft_session(request: Request) -> str | None:
    """The conversation the final request will name: the client's id, else the one
    derived from its opening, when the draft already holds that opening whole."""
    if request.session_id is not None:
        return request.session_id
    messages = request.messages
    known = messages[:-1] if messages[-1].role == "user" else messages
    return derived_session_id(known) if any(m.role == "user" for m in known) else None


def draft_key(request: Request) -> str:
    """Which drafts supersede each other: those of one conversation of one user (by
    its id, else by everything before the message being typed)."""
    sid = draft_session(request)
    if sid is None:
        text = "\0".join(f"{m.role}:{m.content}" for m in _before_typed(request.messages))
        sid = "~" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
    return f"{request.owner}\0{request.cache_scope}\0{sid}"


def _before_typed(messages: Sequence[Message]) -> Sequence[Message]:
    return messages[:-1] if messages and messages[-1].role == "user" else messages


class DraftJob(Job):
    """A draft on the worker: claims a sequence (its conversation's own when live),
    restores what pays, prefills the certain batches one decode a step, and keeps
    their chunks (a request that needs the sequence may take it afterwards)."""

    def __init__(
        self, env: Env, admitted: Admitted, stream: QueueStream, plan: DraftPlan, key: str
    ) -> None:
        super().__init__(env, admitted, stream)
        self.plan, self.key = plan, key
        self.ids = list(plan.ids[: plan.certain])
        self.cuts = list(plan.cuts)
        self.report.prompt_tokens = plan.prompt_tokens
        self.phase = Phase.DRAFTING  # ranks after every other kind of work
        self.superseded = False  # a newer draft of the conversation came (the worker)
        self.ready = 0
        self.outcome: Draft | None = None

    def continued_by(self, other: Job) -> bool:
        """Is ``other`` (a request waiting) this draft's conversation going on? Then
        the draft ends at once, and ``other`` continues in its sequence."""
        if other.request.cache_scope != self.request.cache_scope:
            return False  # another user's, or another cache_salt's
        sid = self.admitted.session_id
        if sid is not None and other.admitted.session_id is not None:
            return sid == other.admitted.session_id
        return common_prefix(self.ids, other.ids) > self.plan.typed_from

    @property
    def _stopped(self) -> bool:
        return self.superseded or self.turn.end is not None or self.stream.cancelled

    def steps(self) -> Generator[None, None, None]:
        early: DraftState | None = (
            "cache off"
            if not self.cached
            else "nothing certain"
            if not self.cuts
            else "superseded"
            if self._stopped
            else "no free sequence"
            if not self._room()
            else None
        )
        if early is not None:
            self._end(early)
            return
        claim_cuts = [*self.cuts, len(self.ids) + 1]  # no last batch to recompute
        with self._claimed(claim_cuts, True) as (res, have, displaced):
            self.report.prompt_tokens = self.plan.prompt_tokens
            self.ready = have
            yield from self._fill(res, have)
            # a newer draft or the next request goes on in this sequence
            if not (self.superseded or self.turn.end is EndNow.FOR_FOLLOWUP):
                self._keep(res, ends_through(self.cuts, self.ready))
            self._end(self._state())
            yield from self._rehome(displaced)

    def _prepare_load(self) -> LoadPlan:
        """The stored chunks of the certain part (every batch of it: no last one is
        left to compute for logits), pinned until _complete_load."""
        store, staging = self.env.store, self.env.staging
        if not self.cached or store is None:
            return LoadPlan()
        room = 0 if staging is None else staging.nbytes
        return store.prepare_load(self.ids, self.cuts, room, self.request.cache_scope)

    def _state(self) -> DraftState:
        if self.ready >= self.plan.certain:
            return "ready"
        return "superseded" if self.superseded else "yielded"

    def _room(self) -> bool:
        """A sequence to compute in that holds nothing another conversation needs:
        this conversation's own, an empty one, or one whose tokens the store keeps."""
        sid = self.admitted.session_id

        def free(r: Resident) -> bool:
            mine = sid is not None and r.session == sid and r.scope == self.request.cache_scope
            return not r.tokens or mine or self._kept(r) >= len(r.tokens)

        return any(not r.busy and free(r) for r in self.env.engine.residents)

    def _fill(self, res: Resident, have: int) -> Iterator[None]:
        """The certain batches after ``have``, one decode a step; a request that
        arrives stops the decode in progress (it keeps nothing, and is redone)."""
        engine = self.env.engine
        t = time.perf_counter()
        while have < len(self.ids):
            yield
            if self._stopped:
                break
            ends = self._decodes(have, self.cuts)[0]
            if engine.prefill(res, self.ids[have : ends[-1]], want_logits=False, ends=ends):
                have = self.ready = ends[-1]
        self.report.prefill_ms = 1000 * (time.perf_counter() - t)

    def end_unstarted(self) -> None:
        """A draft superseded before the worker started it: its outcome, now."""
        self._end("superseded")

    def _end(self, state: DraftState) -> None:
        r = self.report
        self.outcome = Draft(
            self.admitted.session_id,
            self.plan.prompt_tokens,
            self.plan.certain,
            self.ready,
            r.cached_tokens,
            state,
            1000 * (time.perf_counter() - self.t0),
        )
        self.stream.finish(r)
