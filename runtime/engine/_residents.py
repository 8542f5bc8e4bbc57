"""The conversations resident in an engine's context, and the bookkeeping of which
tokens each one's KV holds: claiming a sequence for a prompt (with the longest live
prefix it can reuse), trimming, evicting. Shared by every engine (the llama.cpp one
and the fake): what differs is only the context that removes and copies cells. A
``Resident`` changes only here, through its methods and ``Residents``' (the engines'
decodes and restores and the pipeline call them; tests/engine/test_residents.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..errors import EngineError
from ..kvstore import ends_through, live_prefix

CONTINUATION_SLACK = 64  # tokens a continuation may drop at the end of what is live


class KvCells(Protocol):
    """The context's cell operations the bookkeeping needs (llama.cpp's memory API)."""

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None: ...

    def seq_cp_all(self, src: int, dst: int) -> None: ...


@dataclass
class Resident:
    """A conversation living in the context as sequence ``seq`` (its own KV stream).

    ``tokens`` is exactly what the KV holds, in order; ``bounds`` the ends of the
    batches it was computed in (ascending, the last one ``len(tokens)`` but while its
    prompt's batch goes in pieces, see ``kvstore.piece_end``): a token's KV
    depends on its batch, so a prefix is reusable only up to a batch end that a cold
    prefill of the new prompt would also have (see ``kvstore.reusable``)."""

    seq: int
    tokens: list[int] = field(default_factory=list)
    bounds: list[int] = field(default_factory=list)
    last_used: float = 0.0
    busy: bool = False
    session: str | None = None  # the conversation it holds, when known
    # the cache scope its KV was computed for (Request.cache_scope): never the live
    # prefix of a request of another scope (another user's, another cache_salt)
    scope: str = ""
    # llama.cpp copies a whole stream at the next decode, over whatever a restore would
    # have loaded before it: no restore into a sequence with a copy pending
    copy_pending: bool = False
    # the next-token logits computed by the batch that ended at ``logits_at``, while
    # the KV before it is unchanged: the same prompt again needs no decode at all
    logits: np.ndarray | None = None
    logits_at: int = 0
    # the conversation it held before another prompt continued in it (tokens, bounds,
    # session; see ``Residents.claim``): the store keeps it whole, and it goes back
    # into an empty sequence once that prompt's client has its answer
    displaced: tuple[list[int], list[int], str | None] | None = None

    @property
    def batched(self) -> int:
        """Where its last whole batch ends (0: none); before ``len(tokens)`` only while
        a piece of the next one is in."""
        return self.bounds[-1] if self.bounds else 0

    def live_prefix(self, ids: Sequence[int], cuts: Sequence[int]) -> int:
        """How much of a prompt ``ids`` with batch ends ``cuts`` it holds for it
        (``kvstore.live_prefix``: all of it when it kept this very prompt's logits)."""
        logits_at = self.logits_at if self.logits is not None else None
        return live_prefix(self.bounds, self.tokens, ids, cuts, logits_at)

    def forget_logits(self, below: int = 0) -> None:
        """The KV before ``logits_at`` changes (kept up to ``below`` only)."""
        if self.logits is not None and below < self.logits_at:
            self.logits, self.logits_at = None, 0

    def computed(self, tokens: Sequence[int], ends: Sequence[int] | None = None) -> None:
        """``tokens`` went in after what it holds, in one decode (which ran any copy
        pending first); ``ends``: the batch ends inside them that the decode stands
        for (by default it is one batch, see ``Engine.prefill``)."""
        self.copy_pending = False
        self.tokens.extend(tokens)
        self.bounds.extend((len(self.tokens),) if ends is None else ends)

    def keep_logits(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` are those its last decode computed: kept for the same prompt
        again (``live_prefix``)."""
        self.logits, self.logits_at = logits, len(self.tokens)
        return logits

    def reset(self, tokens: Sequence[int] = (), bounds: Sequence[int] = ()) -> None:
        """Its KV now holds ``tokens``, computed in batches ending at ``bounds`` (a
        restore; by default nothing), and no logits of what it held before."""
        self.tokens, self.bounds = list(tokens), list(bounds)
        self.forget_logits()

    def take_displaced(self) -> tuple[list[int], list[int], str | None] | None:
        """The conversation ``claim`` displaced from it (None: none), handed over once."""
        displaced, self.displaced = self.displaced, None
        return displaced

    def rehome(
        self, session: str | None, scope: str, logits: tuple[np.ndarray, int] | None = None
    ) -> None:
        """Holds the conversation ``session`` of the cache ``scope`` again, restored
        into it while idle, as if just used (see ``Pipeline._rehome``); ``logits``: the
        next-token logits a restored chunk kept, and where it ends (a prompt's end: the
        same prompt again then decodes nothing)."""
        self.session, self.scope, self.last_used = session, scope, time.monotonic()
        if logits is not None:
            self.logits, self.logits_at = logits


class Residents:
    """Claiming, trimming and evicting residents; the engine gives ``residents``, the
    ``evictions`` counter and its context's cells (:class:`KvCells`)."""

    residents: list[Resident]
    evictions: int

    def _cells(self) -> KvCells:
        """The context whose cells the residents are."""
        raise NotImplementedError

    def claim(
        self,
        ids: Sequence[int],
        cuts: Sequence[int],
        session: str | None,
        share: bool,
        stored: int = 0,
        kept: Callable[[Resident], int] | None = None,
        scope: str = "",
    ) -> tuple[Resident, int]:
        """A sequence for a prompt of the cache ``scope`` (only residents of that scope are a
        prefix or a conversation of its own), and how many of its tokens it already
        holds (a prefix that ends where one of ``cuts`` does, see ``Resident.live_prefix``:
        all of them when it holds this prompt's logits). The conversation's own sequence
        continues in place, and so does one that shares a prefix with the prompt at
        least as long as the rest of what it holds, when the store keeps all of that
        (``kept``: how many of a resident's leading tokens it holds): the shared prefix
        needs no copy and no restore, and the conversation it held is ``displaced``.
        Else an idle one is taken (empty first, then the least recently used), and gets
        the longest reusable live prefix of another by a whole-stream copy, unless the
        store holds a longer prefix (``stored`` tokens), which a restore then loads.
        ``share=False`` (no cache): nothing is reused."""
        idle = [r for r in self.residents if not r.busy]
        if not idle:
            raise EngineError("no idle sequence")  # the runtime admits at most one per job
        scored = [(r.live_prefix(ids, cuts), r) for r in idle if r.scope == scope] if share else []
        live, best = max(
            scored,
            key=lambda x: (x[0], session is not None and x[1].session == session),
            default=(0, None),
        )
        if not live:
            best = None
        mine = next(
            (r for r in idle if session and r.session == session and r.scope == scope), None
        )
        if best is not None and (self._continues(best, live, session) or len(idle) == 1):
            res = best  # continues in place (what it holds beyond ``live`` is stored)
        elif best is not None and mine in (None, best) and self._spare(best, live, kept):
            res = best
            res.displaced = (list(res.tokens), list(res.bounds), res.session)
        else:
            others = [r for r in idle if r is not best]
            if mine is not None and mine is not best:
                res = mine
            else:
                res = min(others, key=lambda r: (bool(r.tokens), r.last_used))
            self.evict(res)
            # a live prompt whole (with its logits) decodes nothing, as a restore of it
            # does: the copy in the context is the cheaper of the two
            if best is not None and (live > stored or live == len(ids)):
                self._cells().seq_cp_all(best.seq, res.seq)
                res.tokens, res.bounds = list(best.tokens), list(best.bounds)
                res.logits, res.logits_at = best.logits, best.logits_at  # the same KV
                res.copy_pending = True
            else:
                live = 0
        self.trim(res, live)
        res.busy, res.session, res.scope = True, session, scope
        return res, live

    @staticmethod
    def _continues(res: Resident, live: int, session: str | None) -> bool:
        """Is this request the next turn of the conversation ``res`` holds?"""
        if session is not None and res.session is not None:
            return session == res.session
        # unknown conversations: a continuation diverges only where the last reply was
        # re-tokenized, a little before the end of what the sequence holds
        return len(res.tokens) - live <= CONTINUATION_SLACK

    @staticmethod
    def _spare(res: Resident, live: int, kept: Callable[[Resident], int] | None) -> bool:
        """Can ``res`` give what it holds beyond ``live`` up to another conversation:
        the store keeps all of it, and it is no longer than ``live``?"""
        tail = len(res.tokens) - live
        return kept is not None and tail <= live and kept(res) >= len(res.tokens)

    def release(self, res: Resident) -> None:
        res.busy = False
        res.last_used = time.monotonic()

    def trim(self, res: Resident, n: int) -> None:
        """Keeps the first ``n`` tokens (a batch end, or 0) of what ``res`` holds."""
        if n and n not in res.bounds:
            raise EngineError(f"cannot keep {n} tokens: not the end of a batch")
        if n < len(res.tokens):
            self._cells().seq_rm(res.seq, n, -1)
        del res.tokens[n:]
        res.bounds = ends_through(res.bounds, n)
        res.forget_logits(below=n)

    def evict(self, res: Resident, counted: bool = True) -> None:
        """Empties ``res``; ``counted``: a conversation pushed out (stats)."""
        if res.tokens:
            self._cells().seq_rm(res.seq)
            self.evictions += int(counted)
        res.reset()
        res.session = None
