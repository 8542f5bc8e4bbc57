"""LocalRuntime: the real model behind the Runtime seam (see runtime/serving/_service.py).

A request is admitted once (_admit.py), bounded (Busy beyond ``max_queue``), and
queued for the one worker thread that owns the llama.cpp context (_worker.py), which
runs it as a pipeline job (_pipeline.py). Embeddings are computed on the thread that
asks, in a context of their own, admitted with the replies (runtime/_embed_queue.py).

Stats and session info read the worker's published view and the store's counts,
never ``engine.residents`` (a list the worker changes).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from .._embed_queue import EmbeddingQueue
from ..engine import (
    AS_SET,
    Engine,
    LoaderChoice,
)
from ..errors import Busy, DiskUnavailable, EngineError, RequestError
from ..kvstore import (
    DiskTier,
    MemoryWatcher,
    RamPool,
    StoreStats,
    TieredStore,
    common_prefix,
    reset_directory,
)
from ..policy import Rates, Tuning
from ..settings import Settings
from ..types import (
    TIERS,
    Budget,
    Draft,
    Embeddings,
    Report,
    Request,
    SessionInfo,
    StoredResponse,
    Stream,
)
from ._admit import Admitted, fit, prepare, prompt_tokens
from ._divergence import Prompts
from ._draft import DraftJob, draft_key, draft_session, plan_draft
from ._embeddings import Embedder
from ._pipeline import Env, Job
from ._sessions import SessionBook, check_session_id
from ._stats import DiskStats, LiveStats, MemoryStats, QueueStats, RamStats, Stats, decode_step_ms
from ._streams import QueueStream
from ._view import WorkerView
from ._worker import Worker

log = logging.getLogger(__name__)
T = TypeVar("T")

# The most memory disk reads land in first (touched once at start, see _staging): a
# read that no longer fits there lands in a free pool slot, else in fresh memory.
STAGING_CAP_BYTES = 256 << 20
# Used until the machine is calibrated: the figures of a 2-core CPU box (DESIGN.md).
DEFAULT_RATES = Rates(
    prefill_tps=150.0, tier_gbps={"ram": 4.0, "disk": 0.4}, fixed_ms={"ram": 0.5, "disk": 5.0}
)


class LocalRuntime:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        embeddings: Embedder,
        tuning: Tuning,
        rates: Rates | None = None,
        *,
        model_id: str,
        loader: LoaderChoice = AS_SET,
    ) -> None:
        """The runtime over a built ``engine`` (llama.cpp's or the fake): the factory
        (runtime/serving/_factory.py) loads the model, probes, calibrates and chooses ``tuning``;
        this opens the store and the sessions and starts the worker."""
        self.settings = settings
        self.loader = loader
        self.tuning = tuning
        self.rates = rates or DEFAULT_RATES
        self.engine = engine
        self.prompter = engine.prompter  # admission's: the model's prompt work
        self.model_id = model_id
        self.embeddings = embeddings
        self.embedding_model_id = self.embeddings.model_id
        self.n_ctx = self.tuning.n_ctx
        self.store = self._open_store()
        keep_text = settings.history and not settings.no_cache
        self.book = SessionBook(settings.data_dir / "sessions.db", keep_text=keep_text)
        self.env = Env(
            self.engine,
            self.prompter,
            self._staging(),
            self.store,
            self.tuning,
            self.rates,
            self.book,
            Prompts(),
        )
        self._requests = 0  # counted by the submitting threads, under the worker's lock
        self._background: list[tuple[threading.Thread, threading.Event]] = []
        self._streams: weakref.WeakSet[QueueStream] = weakref.WeakSet()
        hold = self.store.hold if self.store is not None else None
        self.worker = Worker(
            self.engine,
            self.tuning.resident_sequences,
            on_busy=hold,
            decode_batch=self.tuning.decode_batch,
            durable_s=settings.durable_after_s,
        )
        self.counters = self.worker.counters
        waiting = self.worker.waiting
        self._embeds = EmbeddingQueue(self.worker.lock, settings.max_queue, lambda: len(waiting))
        self.watcher = self._watch_memory()

    def _staging(self) -> np.ndarray | None:
        """Where disk reads land: touched now, once (page faults on fresh memory cost
        ~1 ms a MB in a VM, and a disk hit reads a whole conversation's chunks into it)."""
        if self.store is None:
            return None
        prefix = self.engine.blob_bytes(self.n_ctx)
        return np.ones(min(prefix, STAGING_CAP_BYTES), dtype=np.uint8)

    def _watch_memory(self) -> MemoryWatcher | None:
        """Starts the thread that shrinks the RAM pool when the system runs short
        (close() stops it before the store closes)."""
        room, floor = self.store.ram if self.store else None, self.tuning.memory_floor_bytes
        if room is None or not room.pool.n_slots or floor <= 0:
            return None
        if not room.pool.returnable:  # said once; the policy sized it with this in mind
            log.info("the RAM pool is %s: it cannot give memory back", room.pool.memory_kind)
            return None
        watcher = MemoryWatcher(room, floor, self.settings.memory_check_s)
        self.add_background(watcher.thread, watcher.stop)
        watcher.start()
        return watcher

    def _open_store(self) -> TieredStore | None:
        s, t = self.settings, self.tuning
        if s.no_cache:
            return None
        pool = RamPool(t.ram_pool_bytes, self.engine.blob_bytes(t.chunk_tokens))

        def open_disk() -> DiskTier:
            fp = self.engine.fingerprint
            return DiskTier(s.effective_cache_dir, fp, t.zstd_level, t.disk_budget_bytes)

        disk, problem = None, None
        try:
            disk = open_disk()
        except DiskUnavailable as exc:  # degrade, never die: RAM only until it comes back
            problem = str(exc)
        return TieredStore(
            self.engine.fingerprint,
            pool,
            disk,
            t.high_watermark,
            t.low_watermark,
            reopen=open_disk,
            disk_problem=problem,
            retry_s=s.disk_retry_s,
            run_tokens=t.chunk_tokens,
            durable_s=s.durable_after_s,
        )

    # requests ------------------------------------------------------------------------------
    def _check_room(self, owner: str = "") -> None:
        """Busy before any work: tokenizing a large prompt must not precede the 429.
        Past ``max_queue_per_user`` of ``owner``'s own; past ``max_queue`` in all,
        unless none of those waiting is the owner's: one user's flood never locks
        another out (each other user adds at most one), and with one user it is the
        plain ``max_queue``."""
        with self.worker.lock:
            if self.worker.closing:  # no worker will take it: refuse rather than hang
                raise EngineError("the model was unloaded; send the request again")
            mine = self.worker.waiting_of(owner)
            per_user = self.settings.max_queue_per_user or self.settings.max_queue
            if mine >= per_user:
                raise Busy(retry_after=2.0)
            others_only = mine == 0 and bool(self.worker.waiting)
            if self._queued() >= self.settings.max_queue and not others_only:
                raise Busy(retry_after=2.0)

    def _queued(self) -> int:
        """Requests waiting, replies and embeddings (the worker's lock held)."""
        return len(self.worker.waiting) + self._embeds.waiting

    def admit(self, request: Request, budget: Budget | None = None) -> Admitted:
        """Admits ``request`` once (runtime/serving/_admit.py): what generate() runs.
        Busy is raised between the checks and the tokenizing: a 429 must not wait
        for a large prompt's tokens."""
        prepared = prepare(request, self.prompter, budget)
        self._check_room(request.owner)
        return fit(prepared, self.prompter, self.n_ctx, self.settings.overflow)

    def count_tokens(self, request: Request) -> int:
        # counting queues nothing: it is never refused as Busy
        self._check_open()
        return prompt_tokens(prepare(request, self.prompter), self.prompter)

    def tokenize(
        self, text: str, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        # only the vocabulary is read (fixed once loaded): safe off the worker thread
        self._check_open()
        return self.engine.model.tokenize(text, add_special, parse_special)

    def pieces(self, ids: Sequence[int]) -> list[bytes]:
        self._check_open()
        model = self.engine.model
        for token in ids:
            if not 0 <= token < model.n_vocab:
                message = (
                    f"tokens: {token} is not a token id of this model (0 to {model.n_vocab - 1})"
                )
                raise RequestError(message, param="tokens")
        return [model.piece(token, special=True) for token in ids]

    def _check_open(self) -> None:
        if self.worker.closing:  # the model's memory is freed: never read it
            raise EngineError("the model was unloaded; send the request again")

    def generate(self, request: Request | Admitted) -> Stream:
        return self._submit(request, want_logits=False)[0]

    def prompt_logits(self, request: Request) -> tuple[np.ndarray, Report]:
        """Prepares the prompt exactly as generate() would (restore, prefill) and returns
        the next-token logits instead of a reply: the ground truth for cache tests."""
        stream, job = self._submit(request, want_logits=True)
        _, report = stream.text()
        assert job.logits is not None
        return job.logits, report

    def _submit(self, request: Request | Admitted, want_logits: bool) -> tuple[QueueStream, Job]:
        admitted = request if isinstance(request, Admitted) else self.admit(request)
        if admitted.model != self.engine.fingerprint:  # its ids are another model's
            raise RequestError("this request was admitted by another model; send it again")
        stream = QueueStream(on_cancel=lambda: self.worker.abort_prefill(stream))
        self._streams.add(stream)
        with self.worker.lock:
            self._check_room()
            job = Job(self.env, admitted, stream, want_logits)
            self.worker.enqueue(job)
            self._requests += 1
        return stream, job

    def prefill_draft(self, request: Request) -> Draft:
        """Computes the part of a chat's prompt its final version is certain to share
        (_draft.py), as background work, and waits for it: a newer draft of the same
        conversation ends it, a request that comes pauses it, the conversation's next
        request ends it and continues in its sequence."""
        if not request.messages:
            raise RequestError("a draft is a chat: messages must not be empty", "messages")
        sid = draft_session(request)
        sampling = replace(request.sampling, max_tokens=1)  # (the reply's budget is Enter's)
        request = replace(request, session_id=sid, sampling=sampling)
        # no derived id for a first message still being typed: it changes as it grows
        admitted = replace(self.admit(request), session_id=sid)
        t = self.tuning
        plan = plan_draft(self.prompter, admitted.request, t.chunk_tokens, t.batch_tile)
        stream = QueueStream()
        with self.worker.lock:
            self._check_room()
            if len(self.worker.drafts) >= self.settings.max_queue:
                raise Busy(retry_after=2.0)
            job = DraftJob(self.env, admitted, stream, plan, draft_key(request))
            self.worker.enqueue_draft(job)
        stream.text()
        assert job.outcome is not None
        return job.outcome

    def on_worker(self, fn: Callable[[], T]) -> T:
        """Runs ``fn`` on the worker thread, which owns the engine, between two steps of
        the requests in flight, and returns its result (bench: the engine's verbs)."""
        return self.worker.call(fn)

    @property
    def view(self) -> WorkerView:
        """The worker's latest view (a frozen value: read it from any thread)."""
        return self.worker.view

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Waits until every submitted request has finished, captures, their disk
        writes and embeddings included."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        if not self.worker.wait_idle(timeout):
            return False
        if self.store is not None and not self.store.flush(left()):
            return False
        return self._embeds.wait_idle(left())

    def evict_live(self) -> None:
        """Empties every idle resident sequence (their chunks stay in RAM and on disk):
        the next request for them is served from the store. For benchmarks and tests.
        Waits for the work after the replies first: a reply not yet captured holds its
        sequence, and would stay live (and its chunks would not be stored yet)."""
        self.wait_idle()

        def evict_idle() -> None:
            for res in self.engine.residents:
                if not res.busy:
                    self.engine.evict(res, counted=False)  # asked for, not pushed out

        self.worker.call(evict_idle)

    # sessions ------------------------------------------------------------------------------
    def _info(self, row: Any) -> SessionInfo:
        tiers = dict.fromkeys(TIERS, 0)
        if self.store is not None and row.leaf and row.fingerprint == self.engine.fingerprint:
            chain = self.store.chain(row.leaf)
            for record in chain:
                tier = record.tier
                if tier:
                    tiers[tier] += len(record.tokens)
            tokens = [t for r in chain for t in r.tokens]
            tiers["live"] = max(
                (common_prefix(r.tokens, tokens) for r in self.view.residents), default=0
            )
        said = self.env.prompts.last_said(row.owner, row.id) if self.env.prompts else None
        return SessionInfo(
            *(row.id, row.title, row.created, row.updated, row.n_tokens, tiers),
            *(row.messages, row.anonymous),
            divergence=said.text() if said is not None else None,
        )

    def sessions(
        self, search: str = "", anonymous: bool = False, owner: str = ""
    ) -> list[SessionInfo]:
        rows = self.book.list(search=search, anonymous=anonymous, owner=owner)
        return [self._info(row) for row in rows]

    def session(self, session_id: str, owner: str = "") -> SessionInfo | None:
        row = self.book.get(session_id, owner)
        return self._info(row) if row else None

    def prewarm(
        self,
        session_id: str,
        stop: threading.Event | None = None,
        background: bool = False,
        owner: str = "",
    ) -> int:
        """Promotes the conversation's chunks to RAM (at once when a client asks);
        ``background`` (the startup prewarm): each chunk waits until no request is
        being computed, so that it never slows one."""
        row = self.book.get(session_id, owner)
        if row is None or row.leaf is None or self.store is None:
            return 0
        chain = self.store.chain(row.leaf)
        return self.store.promote(chain, make_room=False, stop=stop, background=background)

    def prewarm_recent(self, n: int, stop: threading.Event | None = None) -> int:
        """Promotes the most recent conversations to RAM (run off the request path);
        ``stop`` set (by close()) ends it between two chunks."""
        total = 0
        for row in self.book.list(limit=n, owner=None):  # everyone's
            if stop is not None and stop.is_set():
                break
            total += self.prewarm(row.id, stop, background=True, owner=row.owner)
        return total

    def add_background(self, thread: threading.Thread, stop: threading.Event) -> None:
        """A helper thread that uses the store or the book: close() sets ``stop`` and
        joins it before closing them (a short command may finish before it does)."""
        self._background.append((thread, stop))

    def delete_session(self, session_id: str, owner: str = "") -> bool:
        row = self.book.get(session_id, owner)
        if row is None:
            return False
        if self.store is not None and row.leaf:
            # every user's: a cache group shares chunks across users
            others = (
                o.leaf for o in self.book.list(owner=None) if (o.owner, o.id) != (owner, session_id)
            )
            self.store.drop_unshared(row.leaf, others)
            self.store.flush()  # gone from the disk, too, when the caller hears so
        return self.book.delete(session_id, owner)

    def rename_session(self, session_id: str, title: str, owner: str = "") -> bool:
        return self.book.rename(session_id, title, owner)

    def import_sessions(self, infos: Sequence[SessionInfo], owner: str = "") -> list[bool]:
        if not self.book.keep_text:
            # Accepting would keep the ids and drop the text the client then forgets.
            raise RequestError(
                "history is off: this server keeps no conversation text, so it cannot "
                "take conversations over",
                "history",
            )
        for info in infos:
            check_session_id(info.id, "id")
        return list(self.book.import_(infos, owner))

    def keep_response(self, response: StoredResponse, owner: str = "") -> bool:
        return self.book.keep_response(response, owner)

    def response(self, response_id: str, owner: str = "") -> StoredResponse | None:
        return self.book.response(response_id, owner)

    def delete_response(self, response_id: str, owner: str = "") -> bool:
        return self.book.delete_response(response_id, owner)

    def stats(self) -> dict[str, Any]:
        """Counters and tier usage, in the shape docs/api.md documents (_stats.py):
        from the worker's view and the store's counts, never the live engine."""
        return self.typed_stats().to_json()

    def typed_stats(self) -> Stats:
        """What stats() says, as the typed value; safe from any thread."""
        view = self.view
        c = view.counters
        store = self.store.stats() if self.store is not None else None
        with self.worker.lock:
            waiting, embedding, requests = self._queued(), self._embeds.active, self._requests
        return Stats(
            model=self.model_id,
            requests=requests,
            prompt_tokens=c.get("prompt_tokens", 0),
            completion_tokens=c.get("completion_tokens", 0),
            cached_tokens=sum(c.get(f"tokens_{t}", 0) for t in TIERS),
            hits={t: c.get(f"hits_{t}", 0) for t in TIERS},
            misses=c.get("hits_miss", 0),
            evictions=(store.evictions if store else 0) + view.evictions,
            live=self._live_stats(view),
            ram=RamStats.of_store(store),
            disk=DiskStats.of_store(store, self.tuning.disk_budget_bytes),
            queue=QueueStats(waiting, view.busy + embedding, self.settings.max_queue),
            sessions=self.book.count(),
            batched_steps=c.get("batched_steps", 0),
            batched_tokens=c.get("batched_tokens", 0),
            decode_step_ms=decode_step_ms(c),
            memory=self._memory_stats(store),
            store=store,
        )

    def _live_stats(self, view: WorkerView) -> LiveStats:
        kvb, n = self.engine.kv_bytes_per_token, len(view.residents)  # fixed once loaded
        live = view.live_tokens
        return LiveStats(
            *(live, live * kvb, self.engine.n_ctx * n * kvb), sequences=n, resident=view.resident
        )

    def _memory_stats(self, store: StoreStats | None) -> MemoryStats | None:
        if store is None:
            return None
        watcher = self.watcher
        return MemoryStats(
            floor_bytes=self.tuning.memory_floor_bytes,
            available_bytes=watcher.available if watcher else None,
            watching=watcher is not None,
            under_pressure=bool(watcher and watcher.under_pressure),
            pressure_events=store.pressure_events,
            returned_bytes=store.returned_bytes,
        )

    def embed(self, texts: Sequence[str], stop: threading.Event | None = None) -> Embeddings:
        """On the calling thread, in the embedding context, while the worker goes on
        serving replies; admitted, limited and cancelled (``stop``) as _embed_queue.py
        says."""
        self._check_room()  # a 429 before tokenizing a megabyte of input
        tokenized = self.embeddings.prepare(list(texts))
        stop = stop or threading.Event()
        vectors = self._embeds.run(tokenized, stop, lambda t: self.embeddings.vector(t, stop))
        return self.embeddings.result(tokenized, vectors)

    def settings_report(self) -> dict[str, dict[str, Any]]:
        report = self.tuning.report()
        report["durable_after_s"] = {
            "value": self.settings.durable_after_s,
            "reason": self.settings.durability_reason(),
        }
        return report

    def degraded(self) -> dict[str, str]:
        """What runs in a reduced mode now, and why (cheap: /health asks it)."""
        store = self.store
        if store is not None and store.health.degraded:
            return {"disk": store.health.reason or "the disk tier is off"}
        return {}

    def clear_cache(self) -> None:
        """Empties the store; a disk tier that could not even be opened (a damaged
        index) has its files reset and is tried again at once."""
        store = self.store
        if store is None:
            return
        store.clear()
        if store.disk is None:
            reset_directory(self.settings.effective_cache_dir)
            store.retry_now()

    def cancel_all(self) -> None:
        """Ends every reply in progress as cancelled (a server shutting down): each
        stream still gets its Done, so its client gets a last event."""
        for stream in list(self._streams):
            stream.cancel()
        self._embeds.cancel_all()

    def close(self) -> None:
        if not self.worker.stop():
            return
        self._embeds.close()  # a running one stops after its text; its context is freed below
        for _, stop in self._background:
            stop.set()
        for thread, _ in self._background:
            if thread.ident is not None:  # started
                thread.join()
        self.worker.thread.join()
        if self.store is not None:
            self.store.flush()
            self.store.close()
        self.book.close()
        self.embeddings.close()  # its context lives on the engine's model
        self.engine.close()

    def __enter__(self) -> LocalRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
