"""A Runtime without a model: deterministic text, a pretend KV cache, real threading.

``FakeRuntime`` implements :class:`runtime.service.Runtime` exactly, so the HTTP API,
the CLI and the app run in tests and demos without llama.cpp. What it pretends:

- Tokens are whitespace-led words of a fixed chat rendering of the messages;
  ``tokenize`` gives each word an id the first time it meets it.
- With ``Sampling.logprobs``, each reply word carries a pretend log-probability
  (the most likely of its alternatives, as a greedy draw's would be). A grammar
  cannot be followed without a model: it makes the reply the JSON object
  ``{"text": ...}`` (valid for JSON mode, not for an arbitrary schema).
- A greedy reply (``temperature == 0``) is a fixed function of the last user
  message (or of the raw prompt); ``temperature > 0`` with a seed varies
  reproducibly, without a seed it varies freely.
- The "cache" remembers each conversation's tokens (prompt + reply). A new prompt
  sharing a prefix with one of them reports those tokens restored from the tier
  that conversation sits in; only the rest pays ``prefill_delay`` per token.
- Tiers: the ``slots`` most recently used conversations are "live", the next
  ``ram_sessions`` are in "ram", the next ``disk_sessions`` on "disk", older ones
  are evicted.
- One worker thread serves up to ``slots`` replies at once, one token each per
  round (like a batched decoder), and admits waiting requests in arrival order;
  ``generate`` raises Busy once ``max_queue`` requests wait.
- Embeddings are bags of words, computed at ``prefill_delay`` a word on the calling
  thread, under the same limits, admission and cancellation as the real ones
  (runtime/_embed_queue.py).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._embed_queue import EmbeddingQueue, check_texts, check_tokens
from ._stats import DiskStats, LiveStats, QueueStats, RamStats, Stats
from .engine._tools import check_choice, new_call_id
from .errors import Busy, Cancelled, ContextOverflow, RequestError
from .sessions import check_session_id
from .streams import QueueStream
from .types import (
    TIERS,
    Embeddings,
    Message,
    Report,
    Request,
    SessionInfo,
    StoredResponse,
    Stream,
    TokenLogprob,
    ToolCall,
)

log = logging.getLogger(__name__)

_TOKEN = re.compile(r"\s*\S+")
_VOCABULARY = (
    "the cache keeps every prefix warm so a repeat question costs almost nothing "
    "while new words are computed once and stored in ram or on disk for later "
    "a local model answers quickly when its context is restored instead of rebuilt"
)
_WORDS = tuple(_VOCABULARY.split())
_EMBED_DIM = 64
_RESTORE_S_PER_TOKEN = {"live": 0.0, "ram": 2e-6, "disk": 1e-5}


def tokenize(text: str) -> list[str]:
    """The fake tokenizer: each token is a word with its leading whitespace."""
    return _TOKEN.findall(text)


def render(request: Request) -> str:
    """The fake chat template; a raw completion prompt is used as is."""
    if request.prompt is not None:
        return request.prompt
    parts = [f"<|{m.role}|> {m.content} <|end|>" for m in request.messages]
    return " ".join([*parts, "<|assistant|>"])


def reply_text(request: Request) -> str:
    """The whole reply before max_tokens and stop apply: deterministic when greedy."""
    last_user = [m.content for m in request.messages if m.role == "user"]
    basis = request.prompt if request.prompt is not None else (last_user or [""])[-1]
    sampling = request.sampling
    material = basis.encode()
    if sampling.temperature > 0:
        salt = os.urandom(8).hex() if sampling.seed is None else str(sampling.seed)
        material += f"|{sampling.temperature}|{sampling.top_p}|{salt}".encode()
    rng = random.Random(hashlib.sha256(material).digest())
    words = [rng.choice(_WORDS) for _ in range(6 + rng.randrange(12))]
    text = " " + " ".join(words).capitalize() + "."
    return json.dumps({"text": text.strip()}) if sampling.grammar is not None else text


def logprob_of(word: str, top: int) -> TokenLogprob:
    """A pretend log-probability of a reply word: fixed per word, the word first among
    ``top`` alternatives drawn from the vocabulary."""
    digest = hashlib.sha256(word.encode()).digest()
    logprob = -digest[0] / 64.0
    others = [w for w in _WORDS if w != word.strip()][:top]
    alternatives = [
        TokenLogprob(f" {w}", f" {w}".encode(), logprob - 1.0 - i) for i, w in enumerate(others)
    ]
    best = TokenLogprob(word, word.encode(), logprob)
    top_list = (best, *alternatives)[:top] if top else ()
    return TokenLogprob(word, word.encode(), logprob, top_list)


def _cut(text: str, sampling: Any) -> tuple[list[str], str, str | None]:
    """Applies stop strings then max_tokens; returns the tokens, the finish reason and
    the stop string that ended the text (None: none did)."""
    matched = None
    for stop in sampling.stop:
        if stop and stop in text:
            text, matched = text[: text.index(stop)], stop
    tokens = tokenize(text)
    if len(tokens) > sampling.max_tokens:
        return tokens[: sampling.max_tokens], "length", None
    return tokens, "stop", matched


@dataclass
class _Entry:
    """One conversation's pretend KV: its tokens and the tier holding them."""

    id: str
    title: str
    created: float
    tokens: list[str] = field(default_factory=list)
    messages: tuple[Message, ...] = ()
    tier: str = "live"
    used: int = 0  # LRU clock value of the last use or promotion
    updated: float = 0.0
    anonymous: bool = False  # no request named it (a derived id): not listed by default


@dataclass
class _Job:
    request: Request
    stream: QueueStream
    submitted: float
    session_id: str
    tokens: list[str] = field(default_factory=list)  # the prompt
    reply: list[str] = field(default_factory=list)  # tokens still to send
    sent: list[str] = field(default_factory=list)
    report: Report | None = None


class FakeRuntime:
    """A deterministic stand-in for LocalRuntime; see the module docstring."""

    def __init__(
        self,
        *,
        model_id: str = "warmstart-fake",
        n_ctx: int = 2048,
        max_queue: int = 16,
        slots: int = 4,
        token_delay: float = 0.0,
        prefill_delay: float = 2e-4,
        ram_sessions: int = 8,
        disk_sessions: int = 64,
        reply_words: int | None = None,
    ) -> None:
        self.model_id = self.embedding_model_id = model_id
        self.n_ctx = n_ctx
        self.max_queue = max_queue
        self.slots = slots
        self.token_delay = token_delay
        self.prefill_delay = prefill_delay
        self.reply_words = reply_words  # every reply this long (tests of slow readers)
        self._caps = {"live": slots, "ram": ram_sessions, "disk": disk_sessions}
        self._entries: dict[str, _Entry] = {}
        self._vocab: dict[str, int] = {}  # word -> id, as tokenize() meets them
        self._responses: dict[str, StoredResponse] = {}
        self._clock = 0
        self._counters: collections.Counter[str] = collections.Counter()
        self._waiting: collections.deque[_Job] = collections.deque()
        self._active: list[_Job] = []
        lock = threading.RLock()  # one lock for both queues: one admission decision
        self._cond = threading.Condition(lock)
        self._embeds = EmbeddingQueue(lock, max_queue, lambda: len(self._waiting))
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="fake-runtime", daemon=True)
        self._worker.start()

    # -- the Runtime protocol -------------------------------------------------

    def generate(self, request: Request) -> Stream:
        """Validates now (RequestError, ContextOverflow, Busy); the reply streams later."""
        tokens = self._validate(request)
        job = _Job(request, QueueStream(), time.perf_counter(), self._session_id(request))
        job.tokens = tokens
        with self._cond:
            if self._closed:
                raise RequestError("the runtime is closed")
            waiting = len(self._waiting) + self._embeds.waiting
            if waiting >= self.max_queue:
                raise Busy(retry_after=max(1.0, waiting * self.token_delay * 8))
            self._waiting.append(job)
            self._cond.notify()
        return job.stream

    def count_tokens(self, request: Request) -> int:
        return len(tokenize(render(request)))

    def tokenize(
        self, text: str, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        """Each word (with its leading whitespace) gets an id the first time it is seen;
        the fake has no special tokens."""
        with self._cond:
            return [self._vocab.setdefault(word, len(self._vocab)) for word in tokenize(text)]

    def pieces(self, ids: Sequence[int]) -> list[bytes]:
        with self._cond:
            words = list(self._vocab)
        for token in ids:
            if not 0 <= token < len(words):
                message = f"tokens: {token} is not a token id of this model (0 to {len(words) - 1})"
                raise RequestError(message, param="tokens")
        return [words[token].encode() for token in ids]

    def sessions(self, search: str = "", anonymous: bool = False) -> list[SessionInfo]:
        needle = search.strip().casefold()
        with self._cond:
            entries = sorted(self._entries.values(), key=lambda e: e.updated, reverse=True)
            entries = [e for e in entries if anonymous or not e.anonymous]
            if needle:
                entries = [e for e in entries if _mentions(e, needle)]
            return [self._info(e) for e in entries]

    def session(self, session_id: str) -> SessionInfo | None:
        with self._cond:
            entry = self._entries.get(session_id)
            return None if entry is None else self._info(entry)

    def prewarm(self, session_id: str) -> int:
        """Moves a conversation on disk to RAM; tokens moved (0: unknown or not on disk)."""
        with self._cond:
            entry = self._entries.get(session_id)
            if entry is None or entry.tier != "disk":
                return 0
            entry.tier = "ram"
            self._touch(entry)
            self._rebalance()
            self._counters["prewarmed_tokens"] += len(entry.tokens)
            return len(entry.tokens)

    def delete_session(self, session_id: str) -> bool:
        with self._cond:
            for kept in [r for r in self._responses.values() if r.session_id == session_id]:
                del self._responses[kept.id]
            return self._entries.pop(session_id, None) is not None

    def keep_response(self, response: StoredResponse) -> bool:
        with self._cond:
            self._responses[response.id] = response
            return True

    def response(self, response_id: str) -> StoredResponse | None:
        with self._cond:
            return self._responses.get(response_id)

    def delete_response(self, response_id: str) -> bool:
        with self._cond:
            return self._responses.pop(response_id, None) is not None

    def rename_session(self, session_id: str, title: str) -> bool:
        with self._cond:
            entry = self._entries.get(session_id)
            if entry is not None:
                entry.title = title
            return entry is not None

    def import_session(self, info: SessionInfo) -> bool:
        """An imported conversation has no cached tokens: its tier is "none"."""
        check_session_id(info.id, "id")
        with self._cond:
            if info.id in self._entries:
                return False
            title = info.title or _first_user(info.messages)[:60]
            self._entries[info.id] = _Entry(
                info.id,
                title,
                info.created,
                messages=info.messages,
                tier="none",
                updated=info.updated,
            )
            return True

    def stats(self) -> dict[str, Any]:
        """The same typed Stats as LocalRuntime (_stats.py), counted in conversations."""
        with self._cond:
            entries = list(self._entries.values())
            c = self._counters
            waiting = len(self._waiting) + self._embeds.waiting
            active = len(self._active) + self._embeds.active
            held = {t: [e for e in entries if e.tier == t] for t in TIERS}
            tokens = {t: sum(len(e.tokens) for e in held[t]) for t in TIERS}

            def usage(tier: str) -> tuple[int, int, int, int, int]:
                """tokens, bytes (a pretend 1 KiB a token), no byte capacity, sessions."""
                return tokens[tier], tokens[tier] * 1024, 0, len(held[tier]), self._caps[tier]

            stats = Stats(
                model=self.model_id,
                requests=c["requests"],
                prompt_tokens=c["prompt_tokens"],
                completion_tokens=c["completion_tokens"],
                cached_tokens=sum(c[f"restored_{t}"] for t in TIERS),
                hits={t: c[f"hits_{t}"] for t in TIERS},
                misses=c["misses"],
                evictions=c["evictions"],
                live=LiveStats(*usage("live"), sequences=self.slots, resident=len(held["live"])),
                ram=RamStats(*usage("ram")),
                disk=DiskStats(*usage("disk")),
                queue=QueueStats(waiting, active, self.max_queue),
                sessions=len(entries),
            )
        return stats.to_json()

    def embed(self, texts: Sequence[str], stop: threading.Event | None = None) -> Embeddings:
        """Bag-of-words vectors: each word adds a signed unit at a place its hash picks,
        so equal texts get equal vectors and different words different ones."""
        check_texts(texts)
        tokenized = [tokenize(t) for t in texts]
        total = check_tokens(tokenized, self.n_ctx)
        stop = stop or threading.Event()
        vectors = self._embeds.run(tokenized, stop, lambda words: self._vector(words, stop))
        return Embeddings(model=self.model_id, vectors=tuple(vectors), prompt_tokens=total)

    def _vector(self, words: list[str], stop: threading.Event) -> tuple[float, ...]:
        if stop.wait(len(words) * self.prefill_delay):  # what its prefill would cost
            raise Cancelled("the embedding was stopped")
        vector = [0.0] * _EMBED_DIM
        for word in words:
            digest = hashlib.sha256(word.strip().lower().encode()).digest()
            vector[digest[0] % _EMBED_DIM] += 1.0 if digest[1] & 1 else -1.0
        norm = sum(x * x for x in vector) ** 0.5 or 1.0
        return tuple(x / norm for x in vector)

    def settings_report(self) -> dict[str, dict[str, Any]]:
        reason = "FakeRuntime constructor argument"
        values = {
            "model": self.model_id,
            "n_ctx": self.n_ctx,
            "max_queue": self.max_queue,
            "resident_sequences": self.slots,
            "ram_sessions": self._caps["ram"],
            "disk_sessions": self._caps["disk"],
            "token_delay": self.token_delay,
            "prefill_delay": self.prefill_delay,
        }
        return {name: {"value": value, "reason": reason} for name, value in values.items()}

    def degraded(self) -> dict[str, str]:
        return {}

    def clear_cache(self) -> None:
        """The fake keeps no KV: nothing to clear."""

    def cancel_all(self) -> None:
        with self._cond:
            jobs = [*self._active, *self._waiting]
        for job in jobs:
            job.stream.cancel()
        self._embeds.cancel_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if not self._cond.wait_for(lambda: not self._active and not self._waiting, timeout):
                return False
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return self._embeds.wait_idle(left)

    def close(self) -> None:
        """Stops the worker; replies still pending end as cancelled. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._embeds.close()
        if self._worker.is_alive() and self._worker is not threading.current_thread():
            self._worker.join(timeout=5)
        with self._cond:
            pending = [*self._active, *self._waiting]
            self._active.clear()
            self._waiting.clear()
        for job in pending:
            job.stream.finish(Report(finish_reason="cancelled", session_id=job.session_id))

    # -- validation and bookkeeping (callers hold the lock where noted) -------

    def _validate(self, request: Request) -> list[str]:
        if request.prompt is None and not request.messages:
            raise RequestError("messages must not be empty", "messages")
        if request.prompt is not None and request.messages:
            raise RequestError("give either messages or prompt, not both", "prompt")
        if any(m.role not in ("system", "user", "assistant", "tool") for m in request.messages):
            raise RequestError("a message role must be system, user, assistant or tool", "messages")
        check_choice(request)
        s = request.sampling
        if not 0.0 <= s.temperature <= 2.0:
            raise RequestError("temperature must be between 0 and 2", "temperature")
        if not 0.0 <= s.top_p <= 1.0:
            raise RequestError("top_p must be between 0 and 1", "top_p")
        if s.max_tokens < 1:
            raise RequestError("max_tokens must be at least 1", "max_tokens")
        tokens = tokenize(render(request))
        if len(tokens) + s.max_tokens > self.n_ctx:
            raise ContextOverflow(len(tokens), s.max_tokens, self.n_ctx)
        return tokens

    @staticmethod
    def _session_id(request: Request) -> str:
        """The client's hint, else a name derived from how the conversation starts."""
        if request.session_id:
            return check_session_id(request.session_id)
        head = request.prompt[:200] if request.prompt is not None else repr(request.messages[:2])
        return "conv-" + hashlib.sha256(head.encode()).hexdigest()[:12]

    def _info(self, e: _Entry) -> SessionInfo:
        tiers = {t: (len(e.tokens) if e.tier == t else 0) for t in TIERS}
        return SessionInfo(
            e.id, e.title, e.created, e.updated, len(e.tokens), tiers, e.messages, e.anonymous
        )

    def _touch(self, entry: _Entry) -> None:
        self._clock += 1
        entry.used = self._clock

    def _rebalance(self) -> None:
        """Demotes least recently used conversations down the tiers; lock held."""
        for tier, lower in (("live", "ram"), ("ram", "disk"), ("disk", None)):
            group = [e for e in self._entries.values() if e.tier == tier]
            group.sort(key=lambda e: e.used)
            for entry in group[: max(0, len(group) - self._caps[tier])]:
                if lower is None:
                    del self._entries[entry.id]
                    self._counters["evictions"] += 1
                else:
                    entry.tier = lower

    def _lookup(self, tokens: list[str]) -> tuple[int, str]:
        """The longest cached prefix of ``tokens`` and its tier; lock held.

        At least one prompt token is computed, as a real engine needs the logits of
        the last prompt token to start the reply, except for the same prompt again
        while it is live (the real engine keeps the logits its prompt ended with)."""
        best, tier = 0, "live"
        for entry in self._entries.values():
            n = 0
            for a, b in zip(entry.tokens, tokens, strict=False):
                if a != b:
                    break
                n += 1
            if n > best:
                best, tier = n, entry.tier
        if tier == "live" and best == len(tokens):
            return best, tier
        return min(best, max(0, len(tokens) - 1)), tier

    # -- the worker -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._active:
                    self._cond.wait()
                if self._closed:
                    return
                while self._waiting and len(self._active) < self.slots:
                    self._active.append(self._waiting.popleft())
                round_jobs = list(self._active)
            try:
                for job in round_jobs:
                    if self._step(job):
                        with self._cond:
                            self._active.remove(job)
                            self._cond.notify_all()  # wait_idle
            except Exception as exc:  # a bug here must not hang every client
                log.exception("fake runtime worker failed")
                for job in round_jobs:
                    job.stream.fail(exc)
                with self._cond:
                    self._active.clear()
                    self._cond.notify_all()
            if self.token_delay:
                time.sleep(self.token_delay)

    def _step(self, job: _Job) -> bool:
        """Advances one reply by one token; True when it is finished."""
        if job.stream.cancelled:
            if job.report is None:  # cancelled while waiting: nothing was computed
                job.report = Report(prompt_tokens=len(job.tokens), session_id=job.session_id)
            return self._finish(job, "cancelled")
        if job.report is None:
            self._prefill(job)
        report = job.report
        assert report is not None
        if not job.reply:
            return self._finish(job, report.finish_reason)
        if not job.sent:
            report.ttft_ms = (time.perf_counter() - job.submitted) * 1000
        text = job.reply.pop(0)
        job.sent.append(text)
        top = job.request.sampling.logprobs
        job.stream.put_token(text, () if top is None else (logprob_of(text, top),))
        return False

    def _prefill(self, job: _Job) -> None:
        with self._cond:
            cached, tier = self._lookup(job.tokens) if job.request.use_cache else (0, "live")
        report = Report(prompt_tokens=len(job.tokens), session_id=job.session_id)
        if cached:
            report.restored[tier] = cached
            report.restore_ms = cached * _RESTORE_S_PER_TOKEN[tier] * 1000
            report.decision = f"restored {cached} tokens from {tier}"
        else:
            report.decision = "recomputed: no cached prefix"
        time.sleep(report.restore_ms / 1000)
        started = time.perf_counter()
        # in slices, like the real prefill: a client that leaves stops paying for it
        deadline = started + (len(job.tokens) - cached) * self.prefill_delay
        while (left := deadline - time.perf_counter()) > 0 and not job.stream.cancelled:
            time.sleep(min(left, 0.02))
        report.prefill_ms = (time.perf_counter() - started) * 1000
        text = reply_text(job.request)
        if self.reply_words:
            text = " ".join([text.strip()] * (self.reply_words // max(len(text.split()), 1) + 1))
        job.reply, report.finish_reason, report.stop_sequence = _cut(  # type: ignore[assignment]
            text, job.request.sampling
        )
        job.report = report

    def _finish(self, job: _Job, reason: str) -> bool:
        report = job.report
        assert report is not None
        report.finish_reason = reason  # type: ignore[assignment]
        report.completion_tokens = len(job.sent)
        report.total_ms = (time.perf_counter() - job.submitted) * 1000
        if not job.sent:
            report.ttft_ms = report.total_ms
        reply = _tool_reply(job.request, "".join(job.sent))
        self._remember(job, report, reply)
        job.stream.finish(report, reply)
        return True

    def _remember(self, job: _Job, report: Report, tool_reply: Message | None = None) -> None:
        """Stores the conversation's tokens and counts the request."""
        now = time.time()
        reply = "".join(job.sent)
        with self._cond:
            c = self._counters
            c["requests"] += 1
            c["prompt_tokens"] += report.prompt_tokens
            c["completion_tokens"] += report.completion_tokens
            for tier in TIERS:
                c[f"restored_{tier}"] += report.restored[tier]
                c[f"hits_{tier}"] += bool(report.restored[tier])
            c["misses"] += report.cached_tokens == 0
            if not job.request.use_cache:
                return
            entry = self._entries.get(job.session_id)
            if entry is None:
                title = (job.request.prompt or _first_user(job.request.messages))[:60]
                entry = _Entry(job.session_id, title, now, anonymous=True)
                self._entries[job.session_id] = entry
            entry.anonymous = entry.anonymous and job.request.session_id is None
            entry.tokens = tokenize(render(job.request) + reply)
            turn = tool_reply or Message("assistant", reply.strip())
            entry.messages = (*job.request.messages, turn)
            entry.tier, entry.updated = "live", now
            self._touch(entry)
            self._rebalance()


def _tool_reply(request: Request, text: str) -> Message | None:
    """A request with tools: a forced call is made (with no arguments), else the
    text is the answer. The real model's formats are tested on the real model."""
    if not request.uses_tools:
        return None
    if request.tool_choice in ("auto", "none"):
        return Message("assistant", text)
    name = request.tools[0].name if request.tool_choice == "required" else request.tool_choice
    return Message("assistant", "", tool_calls=(ToolCall(new_call_id(), name, "{}"),))


def _mentions(entry: _Entry, needle: str) -> bool:
    texts = [entry.title, *(m.content for m in entry.messages)]
    return any(needle in t.casefold() for t in texts)


def _first_user(messages: tuple[Message, ...]) -> str:
    return next((m.content for m in messages if m.role == "user"), "")
