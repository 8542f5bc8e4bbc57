"""The worker: the one thread that owns the engine (llama.cpp's context is not
thread-safe), and the queue it serves.

Requests wait and are admitted while a resident sequence is free (users in turn);
the worker then advances every admitted request one bounded step at a time, in the
order the rules of _schedule.py give (round robin among equals), so conversations
are served fairly; what it decided for a step goes to the job as a ``Turn``. A step
of a reply being decoded takes the other replies waiting for their next token along:
up to ``decode_batch`` tokens are decoded in one llama.cpp batch (where the
calibration proved each reply then gets the bits it gets alone), and each reply
samples from its own logits. Work whose client already has its answer (the capture of
a prompt's chunks, the steps that settle a reply) yields to any request whose client
waits, and a request that arrives interrupts such work's decode at once. ``lock`` is
what HTTP threads take to admit a request: the worker holds it for its bookkeeping
only, never while a job computes.

After each step the worker publishes a frozen view (_view.py) of the resident
sequences, its counters and recent events: readers on other threads take that view,
never the engine's own lists.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np

from ..engine import Engine
from ..errors import EngineError
from ..types import TIERS
from ._draft import DraftJob
from ._pipeline import Job
from ._schedule import (
    EndNow,
    JobView,
    Phase,
    Turn,
    ended_for_room,
    holds_up,
    next_admission,
    overdue,
    rank,
)
from ._streams import QueueStream
from ._view import ViewBook, WorkerView

log = logging.getLogger(__name__)
T = TypeVar("T")
Active = collections.deque[Job]
# while a request runs, the view is made anew at most this often (and whenever a
# client got its answer, a job ended, and before the worker is idle): copying the
# residents' tokens after every step took 60 us of a 13 ms decode step, on the thread
# the next step waits for
PUBLISH_S = 0.05


class Worker:
    """``lock`` guards the queue: the runtime takes it to decide a request's admission
    (its embedding queue shares it, so replies and embeddings are one decision)."""

    def __init__(
        self,
        engine: Engine,
        resident_sequences: int,
        on_busy: Callable[[bool], None] | None = None,
        decode_batch: int = 1,
        durable_s: float = math.inf,
    ) -> None:
        """``on_busy(True)`` when a request's client starts waiting on the engine (a
        request queued, or one whose prompt or reply is being computed), and
        ``on_busy(False)`` when none is any more: the store's writes wait meanwhile.
        ``durable_s`` (durable_after_s): the longest a reply's capture waits for an
        idle moment (see ``_capture_overdue``)."""
        self.engine = engine
        self._durable_s = durable_s
        self._forced_at = -math.inf  # when captures last took a waiting client's turn
        self._on_busy = on_busy
        self._busy = False
        self._slots = resident_sequences
        self._decode_batch = decode_batch  # replies decoded together in one step
        self._views = ViewBook()
        self.counters = self._views.counters  # the worker's: only it counts here
        # a client got its answer or a job ended since the last view
        self._published, self._changed = 0.0, False
        self.publish()  # before the thread starts: nothing else reads the engine yet
        self.lock = threading.RLock()
        self._cv = threading.Condition(self.lock)
        self.waiting: collections.deque[Job] = collections.deque()
        # drafts (_draft.py) wait apart: they start only while no client waits
        self.drafts: collections.deque[DraftJob] = collections.deque()
        self._latest: dict[str, DraftJob] = {}  # each conversation's newest draft
        # each owner's latest admission, numbered (users are served in turn)
        self._admitted_at: dict[str, int] = {}
        self._admissions = 0
        self._calls: collections.deque[tuple[Callable[[], Any], Future[Any]]] = collections.deque()
        self.arrivals = 0  # requests and drafts queued so far (calls are not counted)
        self.closing = False
        self.in_background = False  # the worker is in a step of background work
        # another engine's work that a request stops (see ``stoppable``), and whether one did
        self._stoppable: Engine | None = None
        self._stopped = False
        self._stepping: Job | None = None  # the job whose step the worker is in
        self._stepped: dict[int, float] = {}  # when each active job's last step ended
        self._aborting = False  # its prefill's decode was told to stop (its client left)
        self._idle = threading.Event()
        self._idle.set()
        self.thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.thread.start()

    # what other threads call ---------------------------------------------------------------
    def enqueue(self, job: Job) -> None:
        """Queues an admitted job (the caller holds ``lock`` and has checked the room)."""
        with self._cv:
            self.waiting.append(job)
            self.arrivals += 1
            self._set_busy(True)
            if self.in_background:  # a request waits: the background decode stops now
                self.engine.interrupt(True)
            if self._stoppable is not None:
                self._stoppable.interrupt(True)
                self._stopped = True
            self._idle.clear()
            self._cv.notify()

    def enqueue_draft(self, job: DraftJob) -> None:
        """Queues a draft; an older draft of its conversation is superseded: one still
        queued ends now, one running ends at its next step. Its decode in progress is
        not stopped: the newer one goes on from it (drafts come every few hundred ms
        while a batch may take seconds: stopping each would compute nothing)."""
        with self._cv:
            old = self._latest.get(job.key)
            self._latest[job.key] = job
            if old is not None:
                old.superseded = True
                if old in self.drafts:
                    self.drafts.remove(old)
                    old.end_unstarted()
            self.drafts.append(job)
            self.arrivals += 1
            self._idle.clear()
            self._cv.notify()

    def call(self, fn: Callable[[], T]) -> T:
        """Runs ``fn`` on the worker thread, between two steps of the requests in
        flight, and waits for its result."""
        fut: Future[T] = Future()
        with self._cv:
            if self.closing:  # the thread may have ended: nobody would ever run it
                raise EngineError("the runtime is closing")
            self._calls.append((fn, fut))
            self._cv.notify()
        return fut.result()

    def set_decode_batch(self, replies: int) -> None:
        """Decodes up to ``replies`` replies together from the next step on (the bench's
        serial row beside the batched one; never more than the calibration proved
        outside a benchmark: see ``Tuning.decode_batch``)."""
        with self._cv:
            self._decode_batch = max(1, replies)

    def stoppable(self, engine: Engine, fn: Callable[[], T]) -> tuple[T | None, bool]:
        """On the worker thread: runs ``fn``, work of another ``engine`` (the background
        calibration's), which a request queued meanwhile (or already) stops within one
        graph node. Returns (its result, False), or (None, True) when it was stopped:
        what it computed is then worthless (a timing cut short, a decode half done)."""
        with self._cv:
            self._stoppable, self._stopped = engine, bool(self.waiting)
            engine.interrupt(self._stopped)
        out: T | None = None
        try:
            out = fn()
        except Exception:
            if not self._stopped:
                raise
        finally:
            with self._cv:
                stopped, self._stoppable, self._stopped = self._stopped, None, False
                engine.interrupt(False)
        return (None, True) if stopped else (out, False)

    def abort_prefill(self, stream: QueueStream) -> None:
        """A client left while its prompt is being prefilled: the batch in progress
        (up to merge_batch_tokens, seconds on a CPU) stops within one graph node and
        keeps nothing, instead of running to its end before the cancel is seen."""
        with self._cv:
            job = self._stepping
            if job is not None and job.stream is stream and job.phase is Phase.PREFILLING:
                self._aborting = True
                self.engine.interrupt(True)

    def wait_idle(self, timeout: float | None) -> bool:
        """Waits until no job is waiting or running (their background work included)."""
        return self._idle.wait(timeout)

    def stop(self) -> bool:
        """Tells the thread to end once what is queued has ended; False if told before."""
        with self._cv:
            if self.closing:
                return False
            self.closing = True
            self._cv.notify()
        return True

    @property
    def view(self) -> WorkerView:
        """The latest view (a frozen value: read it from any thread)."""
        return self._views.view

    def publish(self) -> None:
        """On the worker thread (or before it starts): the view readers take."""
        self._views.publish(self.engine.residents, self.engine.evictions)
        self._published, self._changed = time.monotonic(), False

    # the thread ----------------------------------------------------------------------------
    def _loop(self) -> None:
        active: Active = collections.deque()
        while True:
            with self._cv:
                # (admission below changes no job's kind; a job queued meanwhile says so)
                self._set_busy(self._clients_wait(active))
                while not (self.closing or self.waiting or self._calls or active or self.drafts):
                    self._cv.wait()
                # stop() drains: a job still waiting (cancelled by a model switch, say)
                # is admitted and ends, never left without its Done
                if self.closing:
                    self._drop_drafts()
                if self.closing and not active and not self._calls and not self.waiting:
                    return
                ending = self._preempt_for_followups(active) + self._make_room(active)
                while self.waiting and len(active) < self._slots:
                    active.append(self._next_waiting(active))
                self._start_draft(active)
                calls = list(self._calls)
                self._calls.clear()
            # the lock is the HTTP threads' (admission): the work runs without it
            for job, why in ending:  # before any step: the jobs admitted take their sequences
                self._end_now(job, why)
            for fn, fut in calls:
                try:
                    fut.set_result(fn())
                except BaseException as exc:
                    fut.set_exception(exc)
            if active:
                self._capture_overdue(active)
                self._step(active)
            # before idle is said: wait_idle() then stats() sees it all
            due = time.monotonic() - self._published >= PUBLISH_S
            if self._changed or calls or not active or due:
                self.publish()
            with self._cv:
                if not active and not self.waiting and not self.drafts:
                    self._idle.set()

    def _seen(self, job: Job) -> JobView:
        """``job`` as the rules (_schedule.py) see it."""
        stepped = self._stepped.get(id(job))
        seen = (job.phase, job.to_prefill, stepped, job.answered_at, job.arrived)
        return JobView(*seen, job.to_decode)

    def _next_waiting(self, active: Active) -> Job:
        """(lock held) Takes the next request to admit (``next_admission``)."""
        answering = collections.Counter(j.request.owner for j in active if j.phase.client_waits)
        best = next_admission([j.request.owner for j in self.waiting], answering, self._admitted_at)
        job = self.waiting[best]
        del self.waiting[best]
        self._admissions += 1
        self._admitted_at[job.request.owner] = self._admissions
        return job

    def waiting_of(self, owner: str) -> int:
        """(lock held) How many of ``owner``'s requests wait to be admitted."""
        return sum(1 for j in self.waiting if j.request.owner == owner)

    def _clients_wait(self, active: Active) -> bool:
        """(lock held) A request is queued, or one in ``active`` has a client waiting."""
        return bool(self.waiting) or any(j.phase.client_waits for j in active)

    def _holds_up(self, job: Job, active: Active) -> bool:
        """(lock held) Whether a long decode of ``job``'s prompt would hold up another
        client (``holds_up``: ``active`` holds the others)."""
        others = [self._seen(other) for other in active]
        return holds_up(self._seen(job), others, bool(self.waiting), time.monotonic())

    def _set_busy(self, busy: bool) -> None:
        """(lock held) Tells ``on_busy`` when a client starts or stops waiting."""
        if busy != self._busy and self._on_busy is not None:
            self._on_busy(busy)
        self._busy = busy

    def _preempt_for_followups(self, active: Active) -> list[tuple[Job, EndNow]]:
        """(lock held) A conversation's next request is waiting (an agent loop, a client
        that sends the follow-up at once): what is left of settling the previous reply
        is what that request prefills anyway, in the same batches, so the old job is
        taken out of ``active`` to end now (its prompt's chunks captured, its session
        saved) instead of making the new one wait. So is a draft the request continues."""
        waiting = {j.admitted.session_id for j in self.waiting if j.admitted.session_id}
        ended = []
        for job in list(active):
            if isinstance(job, DraftJob):
                followed = any(job.continued_by(other) for other in self.waiting)
            else:
                followed = not job.phase.client_waits and job.admitted.session_id in waiting
            if followed:
                ended.append(self._take(active, job, EndNow.FOR_FOLLOWUP))
        return ended

    def _start_draft(self, active: Active) -> None:
        """(lock held) The oldest draft starts while no client waits and a sequence
        is free: it never holds up a request, and yields to one that comes."""
        if self.drafts and not self._clients_wait(active) and len(active) < self._slots:
            job = self.drafts[0]
            if any(isinstance(j, DraftJob) and j.key == job.key for j in active):
                return  # the one it supersedes ends first: it goes on in that sequence
            self.drafts.popleft()
            active.append(job)

    def _drop_drafts(self) -> None:
        """(lock held) Closing: the drafts not started end as superseded."""
        while self.drafts:
            job = self.drafts.popleft()
            job.superseded = True
            job.end_unstarted()

    def _make_room(self, active: Active) -> list[tuple[Job, EndNow]]:
        """(lock held) Requests wait and every resident sequence is taken: work whose
        client has its answer is taken out of ``active`` to end now (``ended_for_room``),
        so that its sequence serves a waiting request instead of the queue waiting
        behind work that only runs while no client waits. A reply not settled yet is
        stored as it was decoded (the next turn prefills its end-of-turn markup itself),
        but for the last token of a reply max_tokens cut (``Job._close_reply``); a
        settle in progress finishes its batches."""
        short = len(self.waiting) - (self._slots - len(active))
        picked = ended_for_room([self._seen(job) for job in active], short)
        return [self._take(active, job, EndNow.FOR_ROOM) for job in [active[i] for i in picked]]

    def _take(self, active: Active, job: Job, why: EndNow) -> tuple[Job, EndNow]:
        """(lock held) Takes ``job`` out of ``active``, to be ended now (``_end_now``)."""
        self.counters["preempted"] += 1
        self._views.event("preempted", job.report.session_id)
        active.remove(job)
        return job, why

    def _end_now(self, job: Job, why: EndNow) -> None:
        """Runs what is left of a job whose client has its answer, at once, without the
        lock: its captures, and what ``why`` leaves of its settling (see ``EndNow``)."""
        try:
            while job.advance(Turn(end=why)):
                pass
        except Exception:
            log.exception("a preempted request failed while it ended")
            self._stepped.pop(id(job), None)
        else:
            self._account(job)

    def _capture_overdue(self, active: Active) -> None:
        """Captures wait for moments no client waits; under a steady stream of requests
        that may be never, and a crash then loses every conversation answered since.
        So the replies answered half of ``durable_s`` ago or more and not captured yet
        are captured now, all in one go, at most once per half of ``durable_s``: a
        waiting client loses that turn at most once an interval, and the chunks reach
        the disk writer in time to be written before ``durable_s`` (the writer's own
        bound: Transfers)."""
        now = time.monotonic()
        half = self._durable_s / 2
        if half == math.inf or now - self._forced_at < half:
            return
        late = [active[i] for i in overdue([self._seen(job) for job in active], now, half)]
        if late and self._clients_wait(active):
            self._forced_at = now
            self.counters["overdue_captures"] += len(late)
            for job in late:
                self._step(active, job)

    def _step(self, active: Active, chosen: Job | None = None) -> None:
        """One step of the job that goes first (``rank``), or of ``chosen``."""
        # work whose client already has its answer (capture, settling a reply) waits
        # while any request still has a client waiting; among it, captures come first:
        # a request that shares a prompt finds its chunks stored sooner, whatever
        # settling is queued
        now = time.monotonic()
        first = min(range(len(active)), key=lambda i: rank(self._seen(active[i]), now))
        if chosen is not None:
            first = active.index(chosen)
        active.rotate(-first)  # the others keep their round-robin order
        job = active.popleft()
        if job.next_step is None:
            with self._cv:  # (enqueue changes waiting under the lock)
                turn = Turn(contended=self._holds_up(job, active))
            self._resume(active, job, turn)
            return
        group = [job]
        group += [j for j in active if j.next_step is not None][: self._decode_batch - 1]
        for other in group[1:]:
            active.remove(other)
        logits, error = self._decode(group)
        for other, decoded in zip(group, logits, strict=True):
            self._resume(active, other, Turn(decoded=decoded), error)

    def _decode(self, group: list[Job]) -> tuple[list[np.ndarray | None], BaseException | None]:
        """The next token of each reply of ``group``: one decode for them all. Returns
        each one's next-token logits (None: the context's last ones), and the failure,
        if any, which is every one's."""
        pairs = [job.next_step for job in group if job.next_step is not None]
        alone: list[np.ndarray | None] = [None] * len(group)
        began = time.perf_counter()
        try:
            if len(pairs) == 1:
                self.engine.step(*pairs[0])  # its logits are the context's last ones
                logits = alone
            else:
                logits = list(self.engine.step_many(pairs))
        except Exception as exc:
            return alone, exc
        # a step's count and time by its replies (the stats' mean step by size: what a
        # step of several costs beside a step of one)
        n = len(pairs)
        self.counters[f"decode_steps_{n}"] += 1
        self.counters[f"decode_us_{n}"] += round(1e6 * (time.perf_counter() - began))
        if n > 1:
            self.counters["batched_steps"] += 1
            self.counters["batched_tokens"] += n
        return logits, None

    def _resume(
        self, active: Active, job: Job, turn: Turn, error: BaseException | None = None
    ) -> None:
        """Runs the job's next step under ``turn`` (``error``: raised in it instead,
        where its decode failed) and puts it back at the end of the round, or accounts
        for its end."""
        waits = job.phase.client_waits
        background = not waits and self._mark_background(True)
        with self._cv:
            self._stepping = job
        try:
            going = job.advance(turn, error)
            self._changed |= waits and not job.phase.client_waits  # it got its answer
        except Exception as exc:
            log.exception("request failed")
            self._stepped.pop(id(job), None)
            self._views.event("failed", job.report.session_id)
            self._changed = True
            job.stream.fail(exc)
            return
        finally:
            if background:
                self._mark_background(False)
            self._end_step()
        if not going:
            self._account(job)
            return
        self._stepped[id(job)] = time.monotonic()
        active.append(job)

    def _end_step(self) -> None:
        with self._cv:
            self._stepping = None
            if self._aborting:  # the next step, of any job, decodes again
                self._aborting = False
                self.engine.interrupt(False)

    def _mark_background(self, running: bool) -> bool:
        """Background work (settling a reply) is running, or no longer: a request
        queued meanwhile interrupts its decode (see ``enqueue``), which is redone
        after it. Cleared before any request's own step, under the same lock."""
        with self._cv:
            self.in_background = running
            self.engine.interrupt(False)
        return running

    def _account(self, job: Job) -> None:
        self._stepped.pop(id(job), None)
        self._changed = True
        if isinstance(job, DraftJob):  # no request: its tokens count when one comes
            with self._cv:  # (enqueue_draft puts a newer one there under the lock)
                if self._latest.get(job.key) is job:
                    del self._latest[job.key]
            self.counters["drafts"] += 1
            return
        r = job.report
        self.counters["prompt_tokens"] += r.prompt_tokens
        self.counters["completion_tokens"] += r.completion_tokens
        for tier in TIERS:
            self.counters[f"tokens_{tier}"] += r.restored[tier]
        best = next((t for t in TIERS if r.restored[t]), "miss")
        self.counters[f"hits_{best}"] += 1
        self._views.event("finished", r.session_id)
