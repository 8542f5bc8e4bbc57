"""A thread-safe Stream: a producer thread puts events, one consumer iterates them."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from ..types import Done, Event, Message, Report, Token, TokenLogprob


class QueueStream:
    """Events flow producer -> consumer through a queue.

    The producer calls ``put_token`` / ``finish`` / ``fail``; it polls ``cancelled``
    between tokens. The consumer iterates; an exception passed to ``fail`` is raised
    in the consumer. ``cancel()`` may come from any thread, at any time.
    """

    def __init__(self, on_cancel: Callable[[], None] | None = None) -> None:
        """``on_cancel``: called (on the cancelling thread) when the consumer cancels,
        so the producer can stop work that polling would see only later."""
        self._queue: queue.Queue[Event | BaseException] = queue.Queue()
        self._cancel = threading.Event()
        self._on_cancel = on_cancel
        self._finished = threading.Event()
        self._delivered: list[str] = []
        self._watcher: Callable[[], None] | None = None
        # the consumer came back for more and found nothing: it has handled all put so far
        self._handled = threading.Event()

    # producer side
    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def put_token(self, text: str, logprobs: tuple[TokenLogprob, ...] = ()) -> None:
        if text or logprobs:
            self._put(Token(text, logprobs))

    def finish(self, report: Report, reply: Message | None = None) -> None:
        if not self._finished.is_set():
            self._finished.set()
            self._put(Done(report, reply))

    def fail(self, exc: BaseException) -> None:
        if not self._finished.is_set():
            self._finished.set()
            self._put(exc)

    def _put(self, item: Event | BaseException) -> None:
        self._handled.clear()  # (before the put: a look after it finds the queue empty)
        self._queue.put(item)
        watcher = self._watcher
        if watcher is not None:
            watcher()

    def wait_handled(self, timeout: float) -> bool:
        """Waits, at most ``timeout`` seconds, until the consumer has handled every event
        put so far (it came back for the next one and found none): False if not by then."""
        return self._handled.wait(timeout)

    @property
    def delivered(self) -> str:
        """The text the consumer took before cancelling: what its user was shown."""
        return "".join(self._delivered)

    # consumer side
    def cancel(self) -> None:
        first = not self._cancel.is_set()
        self._cancel.set()
        if first and self._on_cancel is not None:
            self._on_cancel()

    def watch(self, watcher: Callable[[], None] | None) -> None:
        """``watcher`` is called on the producer's thread after each event is put (and
        once now, for those already waiting): an event loop reads them with ``poll``
        when told, instead of a thread blocking in ``next()`` for each token. None
        stops it."""
        self._watcher = watcher
        if watcher is not None:
            watcher()

    def poll(self) -> Event | None:
        """The next event if one is waiting, else None (a failure is raised)."""
        try:
            item = self._queue.get_nowait()
        except queue.Empty:
            self._handled.set()
            return None
        return self._take(item)

    def _take(self, item: Event | BaseException) -> Event:
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Token) and not self._cancel.is_set():
            self._delivered.append(item.text)
        return item

    def __iter__(self) -> Iterator[Event]:
        while True:
            if self._queue.empty():
                self._handled.set()
            item = self._take(self._queue.get())
            yield item
            if isinstance(item, Done):
                return

    def text(self) -> tuple[str, Report]:
        """Drains the stream: the whole reply and its report."""
        parts: list[str] = []
        for event in self:
            if isinstance(event, Token):
                parts.append(event.text)
            else:
                return "".join(parts), event.report
        raise AssertionError("a stream always ends with Done")
