"""What the engine worker shows other threads: a frozen view it publishes after each
step it takes (and after work run on it), swapped in by reference.

The worker owns the llama.cpp context and its sequence bookkeeping
(``engine.residents``); HTTP and metrics threads read the latest ``WorkerView``
instead, so they never see a list mid-change and never wait on the worker. A view
may be one step old: stats are a moment's figures, never a lock on the work.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

EVENTS_KEPT = 32  # enough to say what just happened, small enough to copy every step


class _Resident(Protocol):
    """What a view reads of a resident sequence (runtime/engine/_engine.Resident)."""

    seq: int
    tokens: list[int]
    busy: bool
    session: str | None


@dataclass(frozen=True)
class ResidentView:
    seq: int
    session: str | None  # the conversation it holds, when known
    tokens: tuple[int, ...]  # exactly what its KV holds (for a session's live prefix)
    busy: bool  # a request is using it


@dataclass(frozen=True)
class Event:
    """Something the worker did to a request: finished, preempted, failed."""

    at: float  # time.time()
    kind: str
    session: str | None


@dataclass(frozen=True)
class WorkerView:
    residents: tuple[ResidentView, ...] = ()
    counters: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    evictions: int = 0  # conversations the engine pushed out of the live context
    events: tuple[Event, ...] = ()

    @property
    def live_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.residents)

    @property
    def resident(self) -> int:
        """Sequences holding a conversation."""
        return sum(1 for r in self.residents if r.tokens)

    @property
    def busy(self) -> int:
        return sum(1 for r in self.residents if r.busy)


class ViewBook:
    """The worker's side: the counters and events it keeps, and the view it makes of
    them and of the residents. Only the worker thread calls ``count``, ``event`` and
    ``publish``; any thread reads ``view``."""

    def __init__(self) -> None:
        self.counters: collections.Counter[str] = collections.Counter()
        self._events: collections.deque[Event] = collections.deque(maxlen=EVENTS_KEPT)
        self.view = WorkerView()

    def event(self, kind: str, session: str | None) -> None:
        self._events.append(Event(time.time(), kind, session))

    def publish(self, residents: Iterable[_Resident], evictions: int) -> WorkerView:
        """A new view from the residents now (their token lists copied: a few
        thousand ints a sequence, microseconds beside a decode step)."""
        views = tuple(ResidentView(r.seq, r.session, tuple(r.tokens), r.busy) for r in residents)
        counters = MappingProxyType(dict(self.counters))
        self.view = WorkerView(views, counters, evictions, tuple(self._events))
        return self.view
