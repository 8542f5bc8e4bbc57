"""One request on the worker thread: find the cached prefix, restore or recompute,
prefill the rest, stream the reply, then capture the new chunks.

``Job.steps()`` is a generator: each ``next()`` does a bounded piece of work, so
the worker can interleave requests of different conversations fairly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .engine._engine import Engine, Resident
from .engine._text import TextAssembler
from .kvstore._keys import chunk_key, cut_points
from .kvstore._ledger import Hit, Record
from .kvstore._store import TieredStore
from .policy import Rates, Tuning, decide_restore
from .streams import QueueStream
from .types import Message, Report, Request

if TYPE_CHECKING:
    from .sessions import SessionBook

log = logging.getLogger(__name__)
PREFILL_STEP = 512  # tokens prefilled before yielding to other conversations
TAIL_TOKENS = 2  # prompt tokens always decoded, never restored (see steps())
CONTINUATION_SLACK = 16  # tokens a re-tokenized reply may differ by at its end


@dataclass
class Env:
    """What a job needs from the runtime (narrow on purpose)."""

    engine: Engine
    staging: np.ndarray | None  # one chunk's worth of touched memory for disk reads
    store: TieredStore | None
    tuning: Tuning
    rates: Rates
    sessions: SessionBook | None


class Job:
    def __init__(
        self,
        env: Env,
        request: Request,
        ids: list[int],
        anchor: int,
        stream: QueueStream,
        session_id: str | None,
        want_logits: bool = False,
    ) -> None:
        self.env, self.request, self.ids, self.anchor = env, request, ids, anchor
        self.want_logits = want_logits
        self.logits: np.ndarray | None = None
        self.stream = stream
        self.report = Report(prompt_tokens=len(ids), session_id=session_id)
        self.promotions: list[Record] = []  # disk chunks to bring into RAM after the reply
        self.t0 = time.perf_counter()

    def steps(self) -> Iterator[None]:
        engine = self.env.engine
        res = self._claim()
        sampler = None
        try:
            have = self._restore(res)
            yield
            t1 = time.perf_counter()
            last = self._tail_start()
            while have < last:
                if self.stream.cancelled:  # the client went away: stop paying for its prompt
                    self.report.finish_reason = "cancelled"
                    self.stream.finish(self.report)
                    return
                piece = self.ids[have : min(have + PREFILL_STEP, last)]
                engine.decode(piece, res.seq, have, want_logits=False)
                have += len(piece)
                res.tokens = self.ids[:have]
                yield
            # The last TAIL_TOKENS prompt tokens are always decoded together, cold or
            # restored: the first token's logits then never depend on how much of the
            # prompt came from the cache (batches of different shapes round differently),
            # and a two-token batch runs on every prefill thread without llama.cpp's
            # single-query attention, which splits the KV by thread and so rounds
            # differently with the number of cells other conversations hold.
            engine.decode(self.ids[last:], res.seq, last)
            res.tokens = list(self.ids)
            self.report.prefill_ms = 1000 * (time.perf_counter() - t1)
            if self.want_logits:  # the next-token distribution is the answer (tests, bench)
                self.logits = engine.ctx.logits()
                self.report.ttft_ms = 1000 * (time.perf_counter() - self.t0)
            else:
                sampler = engine.sampler(self.request.sampling)
                yield from self._generate(res, sampler)
            self.report.total_ms = 1000 * (time.perf_counter() - self.t0)
            # the conversation is listed before its client hears Done; its chunks'
            # key follows once they are captured
            self._save_session(None, len(res.tokens))
            self.stream.finish(self.report)
            yield
            if self.env.store is not None and self.promotions:
                self.env.store.promote(self.promotions)
            leaf = self._capture(res)
            self._save_session(leaf, len(res.tokens))
        finally:
            if sampler is not None:
                sampler.close()
            res.busy = False
            res.last_used = time.monotonic()

    # step 1: a sequence and the longest prefix we already have --------------------------
    def _tail_start(self) -> int:
        return max(len(self.ids) - TAIL_TOKENS, 0)

    def _claim(self) -> Resident:
        """A sequence for this request: the one holding this very conversation (it
        continues in place), else an idle one, which first gets the longest live prefix
        another sequence shares with this prompt (seq_cp: the cells are shared)."""
        engine = self.env.engine
        limit = self._tail_start()  # the prompt's tail is always decoded, for its logits
        best, live = engine.best_resident(self.ids) if self.request.use_cache else (None, 0)
        live = min(live, limit)
        others = [r for r in engine.residents if not r.busy and r is not best]
        if best is not None and (self._continues(best, live) or not others):
            res = best  # when no other is idle, the best gives up its tail (it is stored)
            engine.ctx.seq_rm(res.seq, live, -1)
        else:
            res = min(others, key=lambda r: (bool(r.tokens), r.last_used))
            engine.evict(res)
            if best is not None and live > 0:
                engine.ctx.seq_cp(best.seq, res.seq, 0, live)
            else:
                live = 0
        res.busy = True
        res.session = self.report.session_id
        res.tokens = self.ids[:live]
        self.report.restored["live"] = live
        return res

    def _continues(self, res: Resident, live: int) -> bool:
        """Is this request the next turn of the conversation ``res`` holds?"""
        sid = self.report.session_id
        if sid is not None and res.session is not None:
            return sid == res.session
        # unknown conversations: a continuation diverges only where the last reply was
        # re-tokenized, a few tokens before the end of what the sequence holds
        return len(res.tokens) - live <= CONTINUATION_SLACK

    def _restore(self, res: Resident) -> int:
        """Restores what the store holds beyond the live prefix, when that pays."""
        have = len(res.tokens)
        store = self.env.store
        if store is None or not self.request.use_cache or not self.env.engine.chunkable:
            self.report.decision = (
                "cache off"
                if store is None or not self.request.use_cache
                else "model cannot be chunked: recomputed"
            )
            return have
        t = time.perf_counter()
        hits = store.lookup(self.ids[: self._tail_start()])
        bad: list[bytes] = []
        try:
            have = self._restore_hits(res, [h for h in hits if h.end > have], have, bad)
        finally:
            store.release(hits)
            store.drop(bad)
        self.report.restore_ms = 1000 * (time.perf_counter() - t)
        return have

    def _restore_hits(self, res: Resident, needed: list[Hit], have: int, bad: list[bytes]) -> int:
        engine, store = self.env.engine, self.env.store
        assert store is not None
        if not needed:
            self.report.decision = "live hit" if have else "miss"
            return have
        tiers = [h.record.tier or "disk" for h in needed]
        nbytes = sum(
            h.record.nbytes * (h.end - max(h.record.start, have)) // len(h.record.tokens)
            for h in needed
        )
        slowest = "disk" if "disk" in tiers else "ram"
        decision = decide_restore(
            needed[-1].end - have,
            nbytes,
            slowest,
            self.env.tuning.swap_in_threshold_tokens,
            self.env.rates,
        )
        self.report.decision = decision.reason
        if not decision.restore:
            return have
        start = have
        for hit, tier in zip(needed, tiers, strict=True):
            blob = store.read(hit.record, self.env.staging)
            if tier == "disk":
                self.promotions.append(hit.record)
            if blob is None or not engine.restore(
                blob, res.seq, max(hit.record.start, have), hit.end
            ):
                if blob is not None:
                    log.warning(
                        "llama.cpp refused chunk %s; recomputing from token %d",
                        hit.record.key.hex()[:12],
                        have,
                    )
                    bad.append(hit.record.key)
                break
            self.report.restored[tier] += hit.end - have
            have = hit.end
        if engine.ctx.seq_pos_max(res.seq) != have - 1:
            # a gap or overlap in positions: the restored state cannot be trusted
            log.warning("restored positions do not line up; recomputing the whole prompt")
            engine.ctx.seq_rm(res.seq)
            res.tokens = []
            self.report.restored = dict.fromkeys(self.report.restored, 0)
            self.report.decision = "restore inconsistent: recomputed"
            return 0
        if have < needed[-1].end:
            self.report.decision += f" (stopped at token {have}: chunk missing or refused)"
        res.tokens = self.ids[:have]
        log.debug("restored [%d, %d) for seq %d", start, have, res.seq)
        return have

    # step 2: the reply -----------------------------------------------------------------
    def _generate(self, res: Resident, sampler) -> Iterator[None]:  # type: ignore[no-untyped-def]
        """Streams the reply. A token is always sampled in the same step as the decode
        that produced its logits: the context's logits belong to whichever request
        decoded last, and other requests run between our steps."""
        engine, sampling = self.env.engine, self.request.sampling
        text = TextAssembler(sampling.stop)
        budget = min(sampling.max_tokens, self.env.tuning.n_ctx - len(self.ids))
        n = 0
        finish = "length"
        token = sampler.sample(engine.ctx)
        self.report.ttft_ms = 1000 * (time.perf_counter() - self.t0)
        while True:
            if self.stream.cancelled:
                finish = "cancelled"
                break
            if engine.model.is_eog(token):
                finish = "stop"
                break
            n += 1
            self.stream.put_token(text.feed(engine.model.piece(token)))
            if text.stopped:
                finish = "stop"
                break
            if n >= budget:
                break
            engine.decode([token], res.seq, len(res.tokens))
            res.tokens.append(token)
            token = sampler.sample(engine.ctx)
            yield
        self.stream.put_token(text.flush())
        self.report.completion_tokens = n
        self.report.finish_reason = finish  # type: ignore[assignment]
        self.reply = text.text

    # step 3: keep what was computed ----------------------------------------------------------
    def _capture(self, res: Resident) -> bytes | None:
        """Copies every chunk of this conversation not stored yet into the store (cost
        proportional to the new tokens); returns the key of the last one."""
        store, engine = self.env.store, self.env.engine
        if store is None or not self.request.use_cache or not engine.chunkable:
            return None
        tokens = list(res.tokens)
        parent, c0, leaf = store.root, 0, None
        for c1 in cut_points(len(tokens), self.env.tuning.chunk_tokens, self.anchor):
            segment = tokens[c0:c1]
            key = chunk_key(parent, segment)
            if key not in store:
                reservation = store.reserve(engine.blob_bytes(len(segment)) + 4096)
                try:
                    nbytes = engine.capture(res.seq, c0, c1, reservation.buffer)
                except Exception:
                    store.abort(reservation)
                    log.exception("capture of [%d, %d) failed; it will be recomputed", c0, c1)
                    return leaf
                store.commit(reservation, key, parent, c0, segment, nbytes)
            parent, leaf, c0 = key, key, c1
        return leaf

    def _save_session(self, leaf: bytes | None, n_tokens: int) -> None:
        book, sid = self.env.sessions, self.report.session_id
        if book is None or sid is None:
            return
        messages = self.request.messages
        if getattr(self, "reply", None) is not None:
            messages = (*messages, Message("assistant", self.reply))
        fingerprint = self.env.engine.fingerprint if leaf is not None else None
        book.save(sid, messages, n_tokens, fingerprint, leaf)
