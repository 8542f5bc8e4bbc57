"""The served path reads a runtime's stream on the event loop itself: no thread is
woken per token (on a machine whose cores all run llama.cpp's threads, each
wake-up preempts one of them while the others wait at the step's barrier)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import anyio
import pytest
from warmstart.runtime.api._sse import events
from warmstart.runtime.serving._streams import QueueStream
from warmstart.runtime.types import Done, Event, Report, Token


class _Unwatched:
    """A Stream without watch/poll: read through a worker thread, as before."""

    def __init__(self, inner: QueueStream) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[Event]:
        return iter(self.inner)

    def cancel(self) -> None:
        self.inner.cancel()


def _produce(stream: QueueStream, n: int) -> threading.Thread:
    def run() -> None:
        for i in range(n):
            time.sleep(0.01)
            stream.put_token(f"t{i} ")
        stream.finish(Report())

    thread = threading.Thread(target=run)
    thread.start()
    return thread


async def _read(stream: object, limiter: anyio.CapacityLimiter) -> list[Event]:
    return [event async for event in events(stream, limiter)]  # type: ignore[arg-type]


def test_a_queue_stream_is_read_on_the_loop_without_a_worker_thread() -> None:
    async def main() -> None:
        limiter = anyio.CapacityLimiter(1)
        await limiter.acquire()  # every worker-thread token taken: a thread read would hang
        try:
            stream = QueueStream()
            producer = _produce(stream, 20)
            got = await asyncio.wait_for(_read(stream, limiter), 10)
            producer.join()
        finally:
            limiter.release()
        texts = [e.text for e in got if isinstance(e, Token)]
        assert texts == [f"t{i} " for i in range(20)] and isinstance(got[-1], Done)
        assert stream.delivered == "".join(texts)
        # the same limiter taken, a stream that cannot be watched waits for a thread
        other = QueueStream()
        other.finish(Report())
        await limiter.acquire()
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(_read(_Unwatched(other), limiter), 0.5)
        finally:
            limiter.release()
        assert other.cancelled  # the reader that gave up cancelled it

    asyncio.run(main())


def test_a_reader_that_leaves_cancels_the_stream_and_stops_watching() -> None:
    async def main() -> QueueStream:
        stream = QueueStream()
        stream.put_token("first ")
        async for event in events(stream, anyio.CapacityLimiter(1)):
            assert isinstance(event, Token)
            break  # the client went away after one token
        return stream

    stream = asyncio.run(main())
    assert stream.cancelled and stream._watcher is None
    stream.put_token("after ")  # a producer that goes on wakes nobody and fails nothing


def test_a_failure_put_by_the_producer_is_raised_in_the_reader() -> None:
    async def main() -> None:
        stream = QueueStream()
        stream.put_token("partial ")
        stream.fail(RuntimeError("engine exploded"))
        seen: list[Event] = []
        with pytest.raises(RuntimeError, match="engine exploded"):
            async for event in events(stream, anyio.CapacityLimiter(1)):
                seen.append(event)
        assert [e.text for e in seen if isinstance(e, Token)] == ["partial "]

    asyncio.run(main())
