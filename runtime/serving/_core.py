"""LocalRuntime: the real model behind the Runtime seam (see runtime/serving/_service.py).

One worker thread owns the llama.cpp context. Requests queue (bounded: Busy
beyond ``max_queue``) and are admitted while a resident sequence is free; the
worker then advances every admitted request one bounded step at a time, round
robin, so conversations are served fairly. Embeddings are computed on the thread
that asks, in a context of their own, admitted with the replies (_embed_queue.py).

The worker also owns what it mutates: after each step it publishes a frozen view
(_view.py) of the resident sequences, its counters and recent events; stats and
session info read that view, never ``engine.residents`` (a list the worker changes).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .._embed_queue import EmbeddingQueue
from ..engine import (
    AS_SET,
    NOT_CHECKED,
    Engine,
    ExtraBuffers,
    LlamaModel,
    LoaderChoice,
    LoaderCommand,
    SmokeCommand,
    choose_extra_buffers,
    choose_loader,
    gpu_offload_supported,
)
from ..errors import Busy, DiskUnavailable, EngineError, RequestError
from ..kvstore import DiskTier, MemoryWatcher, RamPool, TieredStore, common_prefix, reset_directory
from ..models import DigestCache, ModelManager
from ..policy import ModelGeometry, Rates, Tuning
from ..settings import Settings
from ..types import TIERS, Embeddings, Report, Request, SessionInfo, StoredResponse, Stream
from ._admit import Admitted, admit
from ._embeddings import Embedder
from ._pipeline import Env, Job
from ._sessions import SessionBook, check_session_id
from ._stats import DiskStats, LiveStats, MemoryStats, QueueStats, RamStats, Stats
from ._streams import QueueStream
from ._view import ViewBook, WorkerView

log = logging.getLogger(__name__)
T = TypeVar("T")

# Used until the machine is calibrated: the figures of a 2-core CPU box (DESIGN.md).
STAGING_CAP_BYTES = 256 << 20  # disk reads beyond this land in the pool or fresh memory
DEFAULT_RATES = Rates(
    prefill_tps=150.0, tier_gbps={"ram": 4.0, "disk": 0.4}, fixed_ms={"ram": 0.5, "disk": 5.0}
)


@dataclass(frozen=True)
class LoadedModel:
    path: Path
    digest: str
    model: LlamaModel
    extra_buffers: ExtraBuffers = NOT_CHECKED
    loader: LoaderChoice = AS_SET


def load_model(
    settings: Settings,
    smoke: SmokeCommand | None = None,
    loader_smoke: LoaderCommand | None = None,
    gpu_offload: bool | None = None,
) -> LoadedModel:
    """Resolves (pulling the default model on first use), digests and loads the model,
    with llama.cpp's extra buffer types only where a smoke decode (``smoke``: its
    child's command, for tests) showed them safe, and the loader's choices (mmap,
    pinned staging, offload) that a smoke load (``loader_smoke``) lived through.
    ``gpu_offload``: whether the build can offload (None: ask it; tests say True)."""
    path = ModelManager(settings.models_dir).resolve(settings.model)
    digest = DigestCache(settings.data_dir / "digests.json").digest(path)
    extra = choose_extra_buffers(
        settings.extra_buffers, path, digest, settings.data_dir / "extra_buffers.json", smoke
    )
    loader = choose_loader(
        mmap=settings.mmap,
        pinned=settings.pinned_staging,
        n_gpu_layers=settings.n_gpu_layers,
        model=path,
        digest=digest,
        extra_buffers=extra.enabled,
        cache_file=settings.data_dir / "loader.json",
        gpu_offload=gpu_offload_supported() if gpu_offload is None else gpu_offload,
        command=loader_smoke,
    )
    loader.apply_env()
    model = LlamaModel(path, loader.n_gpu_layers, extra_buffers=extra.enabled, mmap=loader.mmap)
    return LoadedModel(path, digest, model, extra, loader)


def geometry_of(model: LlamaModel, type_kv: str) -> ModelGeometry:
    return ModelGeometry(
        n_ctx_train=model.n_ctx_train,
        n_layer=model.n_layer,
        kv_bytes_per_token=model.kv_bytes_per_token_estimate(type_kv),
        model_bytes=model.path.stat().st_size,
        swa=model.n_swa > 0,
        recurrent=model.recurrent,
    )


_WAITED_ON, _ANSWERED_UNCAPTURED, _ANSWERED = 0, 1, 2


def _rank(job: Job) -> int:
    """Which work goes first: a client still waiting, then captures, then the rest."""
    if not job.background:
        return _WAITED_ON
    return _ANSWERED if job.captured else _ANSWERED_UNCAPTURED


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
        self.model_id = model_id
        self.embeddings = embeddings
        self.embedding_model_id = self.embeddings.model_id
        self.n_ctx = self.tuning.n_ctx
        self.store = self._open_store()
        keep_text = settings.history and not settings.no_cache
        self.book = SessionBook(settings.data_dir / "sessions.db", keep_text=keep_text)
        staging = None
        if self.store is not None:
            # touched now, once: page faults on fresh memory cost ~1 ms a MB in a VM, and
            # a disk hit reads a whole conversation's chunks into it
            prefix = self.engine.blob_bytes(self.n_ctx)
            staging = np.ones(min(prefix, STAGING_CAP_BYTES), dtype=np.uint8)
        self.env = Env(
            self.engine,
            staging,
            self.store,
            self.tuning,
            self.rates,
            self.book,
            exact_replies=settings.exact_replies,
        )
        self._views = ViewBook()
        self.counters = self._views.counters  # the worker's: only it counts here
        self._requests = 0  # counted by the submitting threads, under the lock
        self._publish()  # before the worker starts: nothing else reads the engine yet
        lock = threading.RLock()  # one lock for both queues: one admission decision
        self._cv = threading.Condition(lock)
        self._waiting: collections.deque[Job] = collections.deque()
        self._embeds = EmbeddingQueue(lock, settings.max_queue, lambda: len(self._waiting))
        self._calls: collections.deque[tuple[Callable[[], Any], Future[Any]]] = collections.deque()
        self._closing = False
        self._background: list[tuple[threading.Thread, threading.Event]] = []
        self._streams: weakref.WeakSet[QueueStream] = weakref.WeakSet()
        self._idle = threading.Event()
        self._in_background = False  # the worker is in a step of background work
        self._stepping: Job | None = None  # the job whose step the worker is in
        self._aborting = False  # its prefill's decode was told to stop (its client left)
        self._idle.set()
        self._worker = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._worker.start()
        self.watcher = self._watch_memory()

    def _watch_memory(self) -> MemoryWatcher | None:
        """Starts the thread that shrinks the RAM pool when the system runs short
        (close() stops it before the store closes)."""
        store, floor = self.store, self.tuning.memory_floor_bytes
        if store is None or store.pool is None or not store.pool.n_slots or floor <= 0:
            return None
        if not store.pool.returnable:  # said once; the policy sized it with this in mind
            log.info("the RAM pool is %s: it cannot give memory back", store.pool.memory_kind)
            return None
        watcher = MemoryWatcher(store, floor, self.settings.memory_check_s)
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
        )

    # requests ------------------------------------------------------------------------------
    def _check_room(self) -> None:
        """Busy before any work: tokenizing a large prompt must not precede the 429."""
        with self._cv:
            if self._closing:  # no worker will take it: refuse rather than hang
                raise EngineError("the model was unloaded; send the request again")
            if self._queued() >= self.settings.max_queue:
                raise Busy(retry_after=2.0)

    def _queued(self) -> int:
        """Requests waiting, replies and embeddings (the lock held)."""
        return len(self._waiting) + self._embeds.waiting

    def admit(self, request: Request) -> Admitted:
        """Admits ``request`` once (runtime/serving/_admit.py): what generate() runs."""
        return admit(request, self.engine, self.n_ctx, self.settings.overflow, self._check_room)

    def count_tokens(self, request: Request) -> int:
        return len(self.admit(request).ids)

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
        if self._closing:  # the model's memory is freed: never read it
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
        stream = QueueStream(on_cancel=lambda: self._abort_prefill(stream))
        self._streams.add(stream)
        with self._cv:
            if self._closing:
                raise EngineError("the model was unloaded; send the request again")
            if self._queued() >= self.settings.max_queue:
                raise Busy(retry_after=2.0)
            job = Job(self.env, admitted, stream, want_logits)
            self._waiting.append(job)
            if self._in_background:  # a request waits: the background decode stops now
                self.engine.interrupt(True)
            self._idle.clear()
            self._requests += 1
            self._cv.notify()
        return stream, job

    # the worker ----------------------------------------------------------------------------
    def _loop(self) -> None:
        active: collections.deque[tuple[Job, Iterator[None]]] = collections.deque()
        while True:
            with self._cv:
                while not (self._closing or self._waiting or self._calls or active):
                    self._cv.wait()
                # close() drains: a job still waiting (cancelled by a model switch, say)
                # is admitted and ends, never left without its Done
                if self._closing and not active and not self._calls and not self._waiting:
                    return
                self._preempt_for_followups(active)
                while self._waiting and len(active) < self.tuning.resident_sequences:
                    job = self._waiting.popleft()
                    active.append((job, job.steps()))
                calls = list(self._calls)
                self._calls.clear()
            for fn, fut in calls:
                try:
                    fut.set_result(fn())
                except BaseException as exc:
                    fut.set_exception(exc)
            if active:
                self._step(active)
            self._publish()  # before idle is said: wait_idle() then stats() sees it all
            with self._cv:
                if not active and not self._waiting:
                    self._idle.set()

    def _publish(self) -> None:
        """On the worker thread (or before it starts): the view readers take."""
        self._views.publish(self.engine.residents, self.engine.evictions)

    @property
    def view(self) -> WorkerView:
        """The worker's latest view (a frozen value: read it from any thread)."""
        return self._views.view

    def _preempt_for_followups(self, active: collections.deque[tuple[Job, Iterator[None]]]) -> None:
        """A conversation's next request is waiting (an agent loop, a client that sends
        the follow-up at once): the previous reply's re-prefill is what that request
        prefills anyway, in the same batches, so the old job ends now (its prompt's
        chunks captured, its session saved) instead of making the new one wait."""
        waiting = {j.admitted.session_id for j in self._waiting if j.admitted.session_id}
        for job, steps in list(active):
            if not (job.background and job.admitted.session_id in waiting):
                continue
            job.preempted = True
            self.counters["preempted"] += 1
            self._views.event("preempted", job.report.session_id)
            active.remove((job, steps))
            try:
                for _ in steps:  # what is left is the capture: no decode runs now
                    pass
            except Exception:
                log.exception("a preempted request failed while it ended")
            else:
                self._account(job)

    def _step(self, active: collections.deque[tuple[Job, Iterator[None]]]) -> None:
        # work whose client already has its answer (capture, a reply's re-prefill) waits
        # while any request still has a client waiting; among it, captures come first:
        # a request that shares a prompt finds its chunks stored sooner, whatever
        # re-prefills are queued
        first = min(range(len(active)), key=lambda i: _rank(active[i][0]))
        active.rotate(-first)  # the others keep their round-robin order
        job, steps = active.popleft()
        background = job.background and self._mark_background(True)
        with self._cv:
            self._stepping = job
        try:
            next(steps)
        except StopIteration:
            self._account(job)
            return
        except Exception as exc:
            log.exception("request failed")
            self._views.event("failed", job.report.session_id)
            job.stream.fail(exc)
            return
        finally:
            if background:
                self._mark_background(False)
            self._end_step()
        active.append((job, steps))

    def _abort_prefill(self, stream: QueueStream) -> None:
        """A client left while its prompt is being prefilled: the batch in progress
        (up to merge_batch_tokens, seconds on a CPU) stops within one graph node and
        keeps nothing, instead of running to its end before the cancel is seen."""
        with self._cv:
            job = self._stepping
            if job is not None and job.stream is stream and job.prefilling:
                self._aborting = True
                self.engine.interrupt(True)

    def _end_step(self) -> None:
        with self._cv:
            self._stepping = None
            if self._aborting:  # the next step, of any job, decodes again
                self._aborting = False
                self.engine.interrupt(False)

    def _mark_background(self, running: bool) -> bool:
        """Background work (a reply's re-prefill) is running, or no longer: a request
        submitted meanwhile interrupts its decode (see ``_submit``), which is redone
        after it. Cleared before any request's own step, under the same lock."""
        with self._cv:
            self._in_background = running
            self.engine.interrupt(False)
        return running

    def _account(self, job: Job) -> None:
        r = job.report
        self.counters["prompt_tokens"] += r.prompt_tokens
        self.counters["completion_tokens"] += r.completion_tokens
        for tier in TIERS:
            self.counters[f"tokens_{tier}"] += r.restored[tier]
        best = next((t for t in TIERS if r.restored[t]), "miss")
        self.counters[f"hits_{best}"] += 1
        self._views.event("finished", r.session_id)

    def _call(self, fn: Callable[[], T]) -> T:
        """Runs ``fn`` on the worker thread (it owns the context) and waits for it."""
        fut: Future[T] = Future()
        with self._cv:
            self._calls.append((fn, fut))
            self._cv.notify()
        return fut.result()

    def on_worker(self, fn: Callable[[], T]) -> T:
        """Runs ``fn`` on the worker thread, which owns the engine, between two steps of
        the requests in flight, and returns its result (bench: the engine's verbs)."""
        return self._call(fn)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Waits until every submitted request has finished, captures, their disk
        writes and embeddings included."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        if not self._idle.wait(timeout):
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

        self._call(evict_idle)

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
        return SessionInfo(
            *(row.id, row.title, row.created, row.updated, row.n_tokens, tiers),
            *(row.messages, row.anonymous),
        )

    def sessions(self, search: str = "", anonymous: bool = False) -> list[SessionInfo]:
        rows = self.book.list(search=search, anonymous=anonymous)
        return [self._info(row) for row in rows]

    def session(self, session_id: str) -> SessionInfo | None:
        row = self.book.get(session_id)
        return self._info(row) if row else None

    def prewarm(self, session_id: str, stop: threading.Event | None = None) -> int:
        row = self.book.get(session_id)
        if row is None or row.leaf is None or self.store is None:
            return 0
        chain = self.store.chain(row.leaf)
        return self.store.transfers.promote(chain, make_room=False, stop=stop)

    def prewarm_recent(self, n: int, stop: threading.Event | None = None) -> int:
        """Promotes the most recent conversations to RAM (run off the request path);
        ``stop`` set (by close()) ends it between two chunks."""
        total = 0
        for row in self.book.list(limit=n):
            if stop is not None and stop.is_set():
                break
            total += self.prewarm(row.id, stop)
        return total

    def add_background(self, thread: threading.Thread, stop: threading.Event) -> None:
        """A helper thread that uses the store or the book: close() sets ``stop`` and
        joins it before closing them (a short command may finish before it does)."""
        self._background.append((thread, stop))

    def delete_session(self, session_id: str) -> bool:
        row = self.book.get(session_id)
        if row is None:
            return False
        if self.store is not None and row.leaf:
            others = (o.leaf for o in self.book.list() if o.id != session_id)
            self.store.drop_unshared(row.leaf, others)
            self.store.flush()  # gone from the disk, too, when the caller hears so
        return self.book.delete(session_id)

    def rename_session(self, session_id: str, title: str) -> bool:
        return self.book.rename(session_id, title)

    def import_session(self, info: SessionInfo) -> bool:
        if not self.book.keep_text:
            # Accepting would keep the ids and drop the text the client then forgets.
            raise RequestError(
                "history is off: this server keeps no conversation text, so it cannot "
                "take conversations over",
                "history",
            )
        check_session_id(info.id, "id")
        return self.book.import_(info)

    def keep_response(self, response: StoredResponse) -> bool:
        return self.book.keep_response(response)

    def response(self, response_id: str) -> StoredResponse | None:
        return self.book.response(response_id)

    def delete_response(self, response_id: str) -> bool:
        return self.book.delete_response(response_id)

    def stats(self) -> dict[str, Any]:
        """Counters and tier usage, in the shape docs/api.md documents (_stats.py):
        from the worker's view and the store's counts, never the live engine."""
        return self.typed_stats().to_json()

    def typed_stats(self) -> Stats:
        """What stats() says, as the typed value; safe from any thread."""
        view = self.view
        c = view.counters
        store = self.store.stats() if self.store is not None else None
        with self._cv:
            waiting, embedding, requests = self._queued(), self._embeds.active, self._requests
        return Stats(
            model=self.model_id,
            requests=requests,
            prompt_tokens=c.get("prompt_tokens", 0),
            completion_tokens=c.get("completion_tokens", 0),
            cached_tokens=sum(c.get(f"tokens_{t}", 0) for t in TIERS),
            hits={t: c.get(f"hits_{t}", 0) for t in TIERS},
            misses=c.get("hits_miss", 0),
            evictions=(store or {}).get("evictions", 0) + view.evictions,
            live=self._live_stats(view),
            ram=RamStats.of_store(store),
            disk=DiskStats.of_store(store, self.tuning.disk_budget_bytes),
            queue=QueueStats(waiting, view.busy + embedding, self.settings.max_queue),
            sessions=self.book.count(),
            memory=self._memory_stats(store),
            store=store,
        )

    def _live_stats(self, view: WorkerView) -> LiveStats:
        kvb, n = self.engine.kv_bytes_per_token, len(view.residents)  # fixed once loaded
        live = view.live_tokens
        return LiveStats(
            *(live, live * kvb, self.engine.n_ctx * n * kvb), sequences=n, resident=view.resident
        )

    def _memory_stats(self, store: dict[str, Any] | None) -> MemoryStats | None:
        if store is None:
            return None
        watcher = self.watcher
        return MemoryStats(
            floor_bytes=self.tuning.memory_floor_bytes,
            available_bytes=watcher.available if watcher else None,
            watching=watcher is not None,
            under_pressure=bool(watcher and watcher.under_pressure),
            pressure_events=store["pressure_events"],
            returned_bytes=store["returned_bytes"],
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
        return self.tuning.report()

    def degraded(self) -> dict[str, str]:
        """What runs in a reduced mode now, and why (cheap: /health asks it)."""
        store = self.store
        if store is not None and store.disk_degraded:
            return {"disk": store.degraded_reason or "the disk tier is off"}
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
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._cv.notify()
        self._embeds.close()  # a running one stops after its text; its context is freed below
        for _, stop in self._background:
            stop.set()
        for thread, _ in self._background:
            if thread.ident is not None:  # started
                thread.join()
        self._worker.join()
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
