"""Embedding requests are requests like any other: bounded, admitted, cancellable.

LocalRuntime follows these rules, over either engine, written here once:

- Limits, checked once the texts are tokenized and before any vector is computed
  (RequestError, param ``input``): at most MAX_EMBED_INPUTS texts, each non-empty and
  within the embedding context, and MAX_EMBED_TOKENS tokens in all.
- Admission: a request counts among the runtime's waiting requests until its turn
  and among the active ones while it is computed; with ``max_queue`` requests waiting
  (replies and embeddings together) the next one is Busy (429).
- One request is computed at a time (there is one embedding context), in arrival
  order, on the thread that asked: never on the thread that serves the replies, so
  chat goes on while a long list is embedded.
- Cancellation: ``stop`` set (the client left), cancel_all() (the server stops, a
  model switch) or close() ends a request before its next text, with Cancelled.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence, Sized
from typing import TypeVar

from .errors import Busy, Cancelled, EngineError, RequestError
from .types import Embeddings

T = TypeVar("T")
V = TypeVar("V")

# Texts in one request: OpenAI's own limit, so clients written for it fit.
MAX_EMBED_INPUTS = 2048
# Tokens in one request, all texts together: what bounds one request's work. On a
# 2-core CPU with a 135M model (about 150 tokens/s) this is minutes of computing, on
# a GPU seconds; a client with more sends several requests, each admitted in turn.
# (2,048 texts of ~870 characters, 1.8 MB, were 11+ minutes of one core before.)
MAX_EMBED_TOKENS = 65_536
# How often a request waiting for its turn looks at its ``stop``: set by another
# thread (the HTTP layer when the client leaves), it cannot notify this condition.
POLL_S = 0.2


def check_texts(texts: Sequence[str]) -> None:
    """At least one text and at most MAX_EMBED_INPUTS (before tokenizing any)."""
    if not texts:
        raise RequestError("input must hold at least one text", "input")
    if len(texts) > MAX_EMBED_INPUTS:
        raise RequestError(
            f"input: {len(texts)} texts; at most {MAX_EMBED_INPUTS} in one request", "input"
        )


def check_tokens(tokenized: Sequence[Sized], n_ctx: int) -> int:
    """The tokens of all texts; RequestError naming the text that is empty or longer
    than the embedding context (``n_ctx``), or the whole input over MAX_EMBED_TOKENS."""
    total = 0
    for i, tokens in enumerate(tokenized):
        where = "input" if len(tokenized) == 1 else f"input.{i}"
        if not len(tokens):
            raise RequestError(f"{where}: an empty text has no embedding", where)
        if len(tokens) > n_ctx:
            raise RequestError(
                f"{where}: {len(tokens)} tokens; the embedding context holds {n_ctx}", where
            )
        total += len(tokens)
    if total > MAX_EMBED_TOKENS:
        raise RequestError(
            f"input: {total} tokens in all; at most {MAX_EMBED_TOKENS} in one request "
            "(send the rest in another)",
            "input",
        )
    return total


class EmbeddingQueue:
    """The turns of embedding requests (see the module docstring).

    ``lock`` is the runtime's own (its replies' queue is guarded by it), so that one
    admission decision sees both queues; ``queued`` is the number of replies waiting
    (read with the lock held)."""

    def __init__(self, lock: threading.RLock, max_queue: int, queued: Callable[[], int]) -> None:
        self._cv = threading.Condition(lock)
        self._max_queue = max_queue
        self._queued = queued
        self._turns: collections.deque[threading.Event] = collections.deque()
        self._running: threading.Event | None = None
        self._closed = False

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn (the lock held, or a snapshot)."""
        return len(self._turns)

    @property
    def active(self) -> int:
        return int(self._running is not None)

    def run(self, items: Sequence[T], stop: threading.Event, one: Callable[[T], V]) -> list[V]:
        """``one(item)`` for each item, in this request's turn; Cancelled once ``stop``
        is set, before the next item. Busy when the runtime's queue is full."""
        with self._turn(stop):
            out = []
            for item in items:
                if stop.is_set():
                    raise Cancelled(
                        "the embeddings were cancelled (the client left, or the "
                        "server is stopping); send the request again"
                    )
                out.append(one(item))
            return out

    @contextlib.contextmanager
    def _turn(self, stop: threading.Event) -> Iterator[None]:
        with self._cv:
            if self._closed:  # nobody will compute it: refuse rather than hang
                raise EngineError("the model was unloaded; send the request again")
            if self._queued() + len(self._turns) >= self._max_queue:
                raise Busy(retry_after=2.0)
            self._turns.append(stop)
            try:
                while self._running is not None or self._turns[0] is not stop:
                    if stop.is_set():
                        raise Cancelled("the embeddings were cancelled before their turn")
                    self._cv.wait(POLL_S)
            finally:
                self._turns.remove(stop)
                self._cv.notify_all()  # the next in line may be first now
            self._running = stop
        try:
            yield
        finally:
            with self._cv:
                self._running = None
                self._cv.notify_all()

    def cancel_all(self) -> None:
        """Stops every request, waiting or running (each ends with Cancelled)."""
        with self._cv:
            for stop in (*self._turns, self._running):
                if stop is not None:
                    stop.set()
            self._cv.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(self._idle, timeout)

    def close(self) -> None:
        """Refuses new requests, stops the others and waits until the running one has
        left its text (its context may be freed then)."""
        with self._cv:
            self._closed = True
        self.cancel_all()
        self.wait_idle()

    def _idle(self) -> bool:
        return self._running is None and not self._turns


def embeddings_of(
    model_id: str, tokenized: Sequence[list[int]], vectors: Sequence[tuple[float, ...]]
) -> Embeddings:
    """The answer to an embedding request: its vectors and the tokens they read."""
    total = sum(len(t) for t in tokenized)
    return Embeddings(model=model_id, vectors=tuple(vectors), prompt_tokens=total)
