"""One request on the worker thread: claim a sequence, restore what pays, prefill the
rest, stream the reply, then keep what was computed.

``Job.steps()`` is a generator: each ``Job.advance`` runs a bounded piece of it (one
prefill batch, one token) under the worker's ``Turn`` for that step, so the worker
interleaves requests of different conversations fairly. The job says where it stands
in ``phase`` (_schedule.py), and never reads the worker's state.

Every prefill of a prompt, cold or cached, computes the same batches
(:func:`~runtime.kvstore._batches.batch_cuts`), and a prefix is kept or restored only up
to the end of one of them: a token's KV then has the same bits however the prompt got
into the context, and a cached reply equals a ``--no-cache`` one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from ..engine import Engine, Prompter, Resident, TextAssembler, TokenSampler, token_logprob
from ..errors import EngineError, WarmstartError
from ..kvstore import (
    LoadPlan,
    ReplyPlan,
    TieredStore,
    aligned_cuts,
    batch_cuts,
    chunk_ends,
    decode_groups,
    ends_through,
    next_decode,
    reply_plan,
)
from ..policy import Rates, Tuning, decide_restore
from ..types import Message, Report, TokenLogprob
from ._schedule import EndNow, Phase, Turn, decode_limits
from ._streams import QueueStream

if TYPE_CHECKING:
    from ._admit import Admitted
    from ._divergence import Prompts
    from ._sessions import SessionBook

log = logging.getLogger(__name__)
# The first token is handed to its reader (the server writes it to the socket) before
# the second one's decode starts, waited for at most this long. Otherwise the decode's
# threads fill every core and the event loop, woken to send the token, waited 3 to 5 ms
# for one in half of the live hits measured (client TTFT: median 8.5 ms, 5.2 with it).
HANDOFF_S = 0.005

# a conversation a claim moved out of its sequence: its tokens, its chunk ends, its
# session (Job._rehome brings it back in)
Displaced = tuple[list[int], list[int], str | None] | None
# what Job._claimed gives: the sequence, the tokens it holds, what it displaced
Claimed = tuple[Resident, int, Displaced]


@dataclass
class Env:
    """What a job needs from the runtime (narrow on purpose)."""

    engine: Engine
    prompter: Prompter  # the model's prompt work: the next turn's prompt
    staging: np.ndarray | None  # touched memory that disk reads land in
    store: TieredStore | None
    tuning: Tuning
    rates: Rates
    sessions: SessionBook | None
    prompts: Prompts | None = None  # each conversation's last prompt (_divergence.py)


class Job:
    def __init__(
        self, env: Env, admitted: Admitted, stream: QueueStream, want_logits: bool = False
    ) -> None:
        """``admitted``: the request as admission left it (runtime/serving/_admit.py), taken
        whole: its prompt ids, its session, its tool plan, its whole history."""
        self.env, self.admitted = env, admitted
        self.request, self.anchors = admitted.request, admitted.anchors
        self.ids = list(admitted.ids)
        self.want_logits = want_logits
        self.logits: np.ndarray | None = None
        self.stream = stream
        self.report = Report(prompt_tokens=len(self.ids), session_id=admitted.session_id)
        self.report.trimmed_messages = admitted.trimmed
        self.promotions: LoadPlan | None = None  # its disk chunks go to RAM after the reply
        self.n_promoted = 0  # how many of its chunks were read
        tuning = env.tuning
        self.cuts = batch_cuts(
            len(self.ids), tuning.chunk_tokens, self.anchors, tile=tuning.batch_tile
        )
        self.cached = self.request.use_cache and env.store is not None and env.engine.chunkable
        self.reply: str | None = None
        # a request with tools: the reply read back as text and tool calls
        self.tools = admitted.tools
        self.reply_message: Message | None = None
        # what the worker sees of it (_schedule.py): where it stands, the prompt's
        # tokens left to compute before its first token (0 until its first step has
        # found what is cached), when its client got the answer (time.monotonic())
        self.phase = Phase.WAITING
        self.to_prefill = 0
        self.to_decode: int | None = None  # the most tokens the reply has left
        self.answered_at: float | None = None
        # the reply's next token, for the worker to decode before the job's next step
        # (alone, or in one batch with other replies' tokens: Tuning.decode_batch)
        self.next_step: tuple[Resident, int] | None = None
        self.turn = Turn()  # what the worker decided for the step in progress
        self.arrived = time.monotonic()  # when it came (the worker's rules: _schedule.py)
        self._steps: Generator[None, None, None] | None = None
        self.t0 = time.perf_counter()

    def advance(self, turn: Turn, error: BaseException | None = None) -> bool:
        """Runs the job's next step as the worker decided (``error``: raised in it
        instead, where the decode it asked for failed); False once it has ended."""
        self.turn = turn
        if self._steps is None:
            self._steps = self.steps()
        try:
            if error is not None:
                self._steps.throw(error)
            else:
                next(self._steps)
        except StopIteration:
            self.phase = Phase.DONE
            return False
        except BaseException:
            self.phase = Phase.DONE
            raise
        return True

    def _answered(self, phase: Phase) -> None:
        """The client has its answer (``stream.finish``): what is left can wait."""
        self.phase, self.answered_at = phase, time.monotonic()

    def steps(self) -> Generator[None, None, None]:
        # a request without the cache (or a runtime without a store) starts cold: it
        # reuses nothing, not even what is live
        share = self.request.use_cache and self.env.store is not None
        with self._claimed(self.cuts, share) as (res, have, displaced):
            self._explain(have)
            self.to_prefill, self.phase = len(self.ids) - have, Phase.PREFILLING
            yield
            t1 = time.perf_counter()
            # the same prompt again, live: its first token comes from the logits kept
            kept = res.logits if have == len(self.ids) else None
            if not (yield from self._prefill(res, have)):
                return  # the client went away during the prefill
            self.report.prefill_ms = 1000 * (time.perf_counter() - t1)
            yield from self._answer(res, kept)
            self.report.total_ms = 1000 * (time.perf_counter() - self.t0)
            # the conversation is listed before its client hears Done; its chunks'
            # key follows once they are captured
            self._save_session(None, len(res.tokens))
            self._remember()
            self.stream.finish(self.report, self.reply_message)
            self._answered(Phase.CAPTURING)
            yield
            yield from self._after_reply(res)
            yield from self._rehome(displaced)

    @contextmanager
    def _claimed(self, cuts: Sequence[int], share: bool) -> Iterator[Claimed]:
        """A sequence claimed for the prompt (``share``: one that holds a prefix of it
        may be reused), the stored chunks that pay restored into it: the sequence, the
        tokens it then holds, and the conversation it displaced. The chunks' pins are
        released once restored (or on failure); the sequence when the block ends."""
        engine = self.env.engine
        plan = self._prepare_load()
        try:
            sid = self.admitted.session_id
            scope = self.request.cache_scope  # (another user's live prefix is never one)
            res, live = engine.claim(self.ids, cuts, sid, share, plan.end, self._kept, scope)
        except BaseException:
            self._complete_load(plan)
            raise
        displaced = res.take_displaced()
        self.report.restored["live"] = live
        try:
            try:
                have = self._restore(res, live, plan)
            finally:
                self._complete_load(plan)
            yield res, have, displaced
        finally:
            if not share:
                # nothing of it was stored: left live, it would be reused by the next
                # cached request without its chunks ever being kept (and a sliding-
                # window model's early chunks can only be cut while they are prefilled)
                engine.evict(res, counted=False)
            engine.release(res)

    def _prefill(self, res: Resident, have: int) -> Generator[None, None, bool]:
        """The prompt after what was live or restored, in the batches a cold run
        computes, a step each; False if the client left (what was prefilled is kept)."""
        engine = self.env.engine
        while have < len(self.ids):
            self.to_prefill = len(self.ids) - have
            # the next decode: chosen at each step, since others may have come meanwhile;
            # from where the batch in progress began (a piece of it may be in)
            stop, bound = self._next_decode(res.batched, have)
            last, done = stop == len(self.ids), False
            if not self.stream.cancelled:
                done = engine.prefill(res, self.ids[have:stop], last, bound)
            have = stop if done else have
            if self.stream.cancelled:  # the client went away: stop paying for its prompt
                yield from self._cancelled_in_prefill(res, have)
                return False
            if not done:  # only a cancel stops a request's own decode (see the worker)
                raise EngineError("a prompt's prefill was interrupted")
            if last:
                engine.keep_logits(res)
            else:
                if engine.model.n_swa > 0 and bound and stop in self._chunk_ends:
                    # a sliding-window cache keeps only the window's cells in a
                    # snapshot: cut each chunk while it is still inside
                    self._keep(res, list(res.bounds))
                yield
        return True

    def _answer(self, res: Resident, kept: np.ndarray | None) -> Iterator[None]:
        """The reply, token by token; or, for prompt_logits, the next-token logits."""
        engine = self.env.engine
        if self.want_logits:  # the next-token distribution is the answer (tests, bench)
            self.logits = kept.copy() if kept is not None else engine.ctx.logits()
            self.report.ttft_ms = 1000 * (time.perf_counter() - self.t0)
            return
        sampler = engine.sampler(self.request.sampling)
        try:
            yield from self._generate(res, sampler, kept)
        finally:
            sampler.close()

    def _after_reply(self, res: Resident) -> Iterator[None]:
        """The client has its answer: the prompt's chunks are kept, the reply is
        settled into the next turn's batches, and the conversation saved with its key."""
        if self.env.store is not None and self.promotions is not None:
            self.env.store.promote(self.promotions.to_promote(self.n_promoted))
        leaf = self._keep(res, self.cuts[:-1])
        self.phase = Phase.SETTLING
        leaf = (yield from self._settle(res)) or leaf
        self._save_session(leaf, len(res.tokens), kept=True)

    def _rehome(self, displaced: Displaced) -> Iterator[None]:
        """The conversation this prompt's sequence held before (``Resident.displaced``)
        is loaded from the store's RAM into an empty idle sequence, while no client
        waits, so that a return to it is a live hit again. Nothing is evicted for it,
        and a chunk on disk only is not read for it: the return restores it then."""
        store, engine = self.env.store, self.env.engine
        if displaced is None or store is None:
            return
        yield
        home = next((r for r in engine.residents if not (r.busy or r.tokens)), None)
        if self.turn.end is not None or home is None:
            return  # requests wait (or came for the sequences): they go first
        tokens, bounds, session = displaced
        plan = store.prepare_load(tokens, bounds, scope=self.request.cache_scope)
        try:
            blobs, kept = [], None  # kept: the last logits a chunk keeps, and where
            for load, record in zip(plan.loads, plan.records, strict=True):
                blob, logits = store.read_logits(record) if load.tier == "ram" else (None, None)
                if blob is None:
                    break
                blobs.append(blob)
                kept = (logits, record.end) if logits is not None else kept
            ends = plan.ends(len(blobs))
            if ends and engine.restore(home, blobs, tokens, ends_through(bounds, ends[-1])):
                home.rehome(session, self.request.cache_scope, kept)
        finally:
            store.complete_load(plan)

    def _cancelled_in_prefill(self, res: Resident, have: int) -> Iterator[None]:
        """Cut short before the first token (Ctrl-C, a client that left): the turn is kept
        as interrupted with nothing shown, as a reply cut later keeps what was shown, and
        the batches already prefilled are stored, so asking again does not redo them."""
        self.report.finish_reason = "cancelled"
        self.reply = ""
        if res.batched < len(res.tokens):  # a piece of a batch is no batch: it goes
            self.env.engine.trim(res, res.batched)
        self._save_session(None, len(res.tokens))
        self.stream.finish(self.report)
        self._answered(Phase.CAPTURING)
        yield
        leaf = self._keep(res, ends_through(self.cuts[:-1], have))
        if leaf is not None:
            self._save_session(leaf, len(res.tokens), kept=True)

    def _explain(self, have: int) -> None:
        """Why this prompt reused less than its conversation's last one, pointed at the
        text (_divergence.py): in its report (``x_warmstart``) and the log."""
        prompts, engine = self.env.prompts, self.env.engine
        if prompts is None or not self.cached or have >= len(self.ids):
            return
        found = prompts.explain(self.admitted, have, engine.fingerprint, self.env.sessions)
        if found is not None:
            self.report.divergence = found.as_dict()
            log.info("conversation %s recomputed from %s", self.admitted.session_id, found.text())

    def _remember(self) -> None:
        if self.env.prompts is not None and self.cached:
            reply = self.reply_message or Message("assistant", self.reply or "")
            self.env.prompts.remember(self.admitted, reply, self.env.engine.fingerprint)

    @cached_property
    def _chunk_ends(self) -> set[int]:
        """Where the prompt's stored chunks end (a run of one-token batches is one)."""
        return chunk_ends(self.cuts, self.env.tuning.chunk_tokens)

    def _limits(self) -> tuple[int, int]:
        """The most tokens one decode may hold, and the pieces a long batch may go in,
        as this step's turn allows (``decode_limits``)."""
        return decode_limits(self.env.tuning.merge_batch_tokens, self.turn.contended)

    def _next_decode(self, begun: int, have: int) -> tuple[int, list[int]]:
        """Where the prompt's next decode stops, and the batch ends it completes."""
        tuning = self.env.tuning
        most, piece = self._limits()
        chunk, tile = tuning.chunk_tokens, tuning.batch_tile
        return next_decode(begun, have, self.cuts, chunk, tile, most, piece)

    def _decodes(self, have: int, cuts: Sequence[int]) -> list[list[int]]:
        tuning = self.env.tuning
        most, _ = self._limits()
        return decode_groups(have, cuts, tuning.chunk_tokens, most, tuning.batch_tile)

    # step 1: the longest prefix worth restoring ------------------------------------------
    def _prepare_load(self) -> LoadPlan:
        """The stored chunks of this prompt, pinned until _complete_load: its last
        batch's too when the store kept the logits it gave (a repeat then decodes
        nothing, as a live one does)."""
        store, staging = self.env.store, self.env.staging
        if not self.cached or store is None:
            return LoadPlan()
        room = 0 if staging is None else staging.nbytes
        scope = self.request.cache_scope
        return store.prepare_load(self.ids, self.cuts, room, scope, logits=True)

    def _kept(self, res: Resident) -> int:
        """How many of the leading tokens ``res`` holds the store keeps."""
        store = self.env.store
        if not self.cached or store is None:
            return 0
        return store.held(res.tokens, res.bounds, res.scope)

    def _complete_load(self, plan: LoadPlan) -> None:
        if self.env.store is not None:
            self.env.store.complete_load(plan)

    def _restore(self, res: Resident, live: int, plan: LoadPlan) -> int:
        """Restores what the store holds beyond the live prefix, when that pays."""
        store = self.env.store
        if not self.cached or store is None:
            self.report.decision = (
                "cache off"
                if store is None or not self.request.use_cache
                else "model cannot be chunked: recomputed"
            )
            return live
        t = time.perf_counter()
        have = self._restore_plan(res, plan, live)
        self.report.restore_ms = 1000 * (time.perf_counter() - t)
        return have

    def _restore_plan(self, res: Resident, plan: LoadPlan, live: int) -> int:
        if plan.end <= live:
            self.report.decision = "live hit" if live else "miss"
            return live
        # the whole prefix is loaded at once (a blob replaces what a sequence holds)
        decision = decide_restore(
            plan.end - live,
            plan.nbytes,
            plan.slowest,
            self.env.tuning.swap_in_threshold_tokens,
            self.env.rates,
            live,
        )
        self.report.decision = decision.reason
        if not decision.restore:
            return live
        assert self.env.store is not None
        blobs, logits = self.env.store.load_prompt(plan, self.env.staging)
        self.promotions, self.n_promoted = plan, len(blobs)
        ends = plan.ends(len(blobs))
        if not ends or ends[-1] <= live:
            self.report.decision += " (chunk missing: recomputed)"
            return live
        # the batches the prefix was computed in: the prompt's own (a chunk stands for
        # one, or for a run of one-token ones)
        bounds = ends_through(self.cuts, ends[-1])
        if not self.env.engine.restore(res, blobs, self.ids, bounds):
            log.warning("llama.cpp refused the cached prefix; recomputing the prompt")
            self.report.restored = dict.fromkeys(self.report.restored, 0)
            self.report.decision = "restore refused: recomputed"
            return 0
        if logits is not None:  # those its last batch gave: the same prompt needs no decode
            res.keep_logits(logits)
        self.report.restored["live"] = 0
        for tier, tokens in plan.tokens_by_tier(len(blobs)).items():
            self.report.restored[tier] += tokens
        return ends[-1]

    # step 2: the reply -----------------------------------------------------------------
    def _generate(  # type: ignore[no-untyped-def]
        self, res: Resident, sampler, kept: np.ndarray | None
    ) -> Iterator[None]:
        """Streams the reply. A token is always sampled in the same step as the decode
        that produced its logits: the context's logits belong to whichever request
        decoded last, and other requests run between our steps. ``kept``: the first
        token's logits, when the prompt needed no decode."""
        engine, sampling = self.env.engine, self.request.sampling
        text = TextAssembler(sampling.stop)
        budget = min(sampling.max_tokens, self.env.tuning.n_ctx - len(self.ids))
        n = 0
        finish = "length"
        token, logprob = self._sample(sampler, kept)
        self.report.ttft_ms = 1000 * (time.perf_counter() - self.t0)
        self.to_prefill, self.phase = 0, Phase.DECODING
        while True:
            if self.stream.cancelled:
                finish = "cancelled"
                break
            if engine.model.is_eog(token):
                finish = "stop"
                break
            n += 1
            self.stream.put_token(text.feed(engine.model.piece(token)), logprob)
            if text.stopped:
                finish = "stop"
                break
            if n >= budget:
                break
            if n == 1:  # the first token: see HANDOFF_S
                self.stream.wait_handled(HANDOFF_S)
            self.next_step, self.to_decode = (res, token), budget - n
            yield  # the worker decodes it, alone or with other replies' tokens
            self.next_step = None
            token, logprob = self._sample(sampler, self.turn.decoded)
        self.stream.put_token(text.flush())
        self.report.completion_tokens = n
        self.report.finish_reason = finish  # type: ignore[assignment]
        self.report.stop_sequence = text.matched
        # cut short, the turn keeps what its reader took (was shown), not what was decoded
        self.reply = self.stream.delivered if finish == "cancelled" else text.text
        if self.tools is not None and self.tools.active and finish != "cancelled":
            self.reply_message = self.tools.parse(self.reply)

    def _sample(
        self, sampler: TokenSampler, kept: np.ndarray | None = None
    ) -> tuple[int, tuple[TokenLogprob, ...]]:
        """The next token, and its log-probability when the request asks for them
        (from the logits the sampler drew from: it leaves them unchanged)."""
        engine, top = self.env.engine, self.request.sampling.logprobs
        token = sampler.sample(engine.ctx, kept)
        if top is None:
            return token, ()
        model = engine.model

        def piece(t: int) -> bytes:  # special tokens (end of turn) by their name
            return model.piece(t) or model.token_text(t).encode()

        logits = kept if kept is not None else engine.ctx.logits()
        return token, (token_logprob(logits, token, top, piece),)

    # step 3: keep what was computed ----------------------------------------------------------
    def _keep(self, res: Resident, ends: Sequence[int]) -> bytes | None:
        """Stores the chunk of every batch in ``ends`` (batch ends ``res`` computed or
        restored) that the store lacks; returns the key of the last one kept."""
        store, engine = self.env.store, self.env.engine
        if not self.cached or store is None or not ends:
            return None
        # the chunk ending where the sequence's kept logits were given keeps them too
        logits = (res.logits_at, res.logits) if res.logits is not None else None
        scope = self.request.cache_scope
        plan = store.prepare_store(res.tokens, ends, engine.blob_bytes, scope=scope, logits=logits)
        for run in plan.runs():  # only the new chunks' cells are read (Engine.snapshot)
            snapshot = None
            for save in run:
                try:
                    snapshot = snapshot or engine.snapshot(res.seq, run[0].start, run[-1].end)
                    save.nbytes = engine.cut(snapshot, save.start, save.end, save.buffer)
                except Exception as exc:
                    log.warning(
                        "capture of [%d, %d) failed (%s); it will be recomputed",
                        *(save.start, save.end, exc),
                    )
                    return store.complete_store(plan)
        return store.complete_store(plan)

    def _settle(self, res: Resident) -> Generator[None, None, bytes | None]:
        """Brings the sequence to the next turn's prompt, up to its new message, after
        the client has its answer, and stores those chunks: the next turn then holds,
        live and stored, what a cold prefill of its history computes. Returns the key
        of the last chunk.

        A prefill steps through a reply a token at a time, as it was decoded (see
        ``kvstore.turn_anchors``), so the decoded KV is kept as it is: what is left is the
        reply's end-of-turn markup, and whatever follows a place where the reply, as
        the template renders it, is tokenized otherwise than it was sampled. The next
        prompt is this one's messages and the reply, as the template renders them; a
        client that sends the history back otherwise reuses less, never wrong KV."""
        if self.turn.end is EndNow.FOR_FOLLOWUP:  # it prefills what is left itself
            return None
        if not (self.cached and len(res.tokens) > len(self.ids)):
            return None
        target, cuts = self._next_prompt(res)
        plan = reply_plan(res.bounds, res.tokens, target, cuts, len(self.ids))
        if self.turn.end is EndNow.FOR_ROOM:  # the reply as decoded (the next turn shares it)
            held = self._close_reply(res, plan)
            return self._keep(res, ends_through(res.bounds, held))
        if not plan.cuts:
            return None
        engine, keep = self.env.engine, plan.reused
        engine.trim(res, keep)
        for ends in self._decodes(keep, plan.cuts):
            batch = target[keep : ends[-1]]
            while True:  # a request that arrives stops the batch; it is redone after it
                yield
                if self.turn.end is EndNow.FOR_FOLLOWUP:
                    return None
                if engine.prefill(res, batch, want_logits=False, ends=ends):
                    break
            keep = ends[-1]
        return self._keep(res, ends_through(res.bounds, plan.cuts[-1]))

    def _close_reply(self, res: Resident, plan: ReplyPlan) -> int:
        """Decodes the reply's last token when it was sampled but never decoded, and
        the end-of-turn token where it is a batch of its own (``ReplyPlan.closing``:
        a token at a time, at most two, which the waiting request hardly notices);
        returns how much of the next turn's prompt the sequence then holds."""
        if plan.closing is None:
            return plan.reused
        engine, held = self.env.engine, plan.reused
        engine.trim(res, held)
        for end in range(held + 1, plan.closing + 1):  # one-token batches
            if not engine.prefill(res, plan.target[held:end], want_logits=False):
                break  # (nothing interrupts a job the worker ends at once)
            held = end
        return held

    def _next_prompt(self, res: Resident) -> tuple[list[int], list[int]]:
        """The tokens the next turn's prompt starts with, and its batch ends over them.
        A raw completion prompt has no next turn to render: what it holds is kept up to
        its last aligned batch end."""
        chunk, tile = self.env.tuning.chunk_tokens, self.env.tuning.batch_tile
        reply = self.reply_message or Message("assistant", self.reply or "")
        if self.request.messages:
            try:
                nxt = replace(self.request, messages=(*self.request.messages, reply))
                ids, anchors = self.env.prompter.prompt_ids(nxt, generation=False)
            except WarmstartError as exc:  # a template that cannot render it: settle less
                log.info("the next turn cannot be rendered (%s); the reply is not kept", exc)
            else:
                return ids, batch_cuts(len(ids), chunk, anchors, tail=0, tile=tile)
        tokens = list(res.tokens)
        return tokens, aligned_cuts(0, len(tokens), chunk, self.anchors, tile)

    def _save_session(self, leaf: bytes | None, n_tokens: int, kept: bool = False) -> None:
        """Saves the turn (before its Done); ``kept``: the chunks' key once they are
        captured, which never brings back a session deleted since the Done."""
        book, sid = self.env.sessions, self.admitted.session_id
        if book is None or sid is None:
            return
        if kept:
            fingerprint = self.env.engine.fingerprint if leaf is not None else None
            book.keep_leaf(sid, n_tokens, fingerprint, leaf, self.request.owner)
            return
        history = self.admitted.history
        messages = history if history is not None else self.request.messages
        if self.reply_message is not None:
            messages = (*messages, self.reply_message)
        elif self.reply is not None:
            cut = self.report.finish_reason == "cancelled"
            messages = (*messages, Message("assistant", self.reply, interrupted=cut))
        fingerprint = self.env.engine.fingerprint if leaf is not None else None
        # no id from the client: a derived one, kept out of the conversation list
        anonymous = self.request.session_id is None
        book.save(sid, messages, n_tokens, fingerprint, leaf, anonymous, self.request.owner)
