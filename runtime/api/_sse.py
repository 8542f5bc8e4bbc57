"""Driving a blocking runtime Stream from the event loop, streamed (SSE) or whole.

A Stream blocks its consumer between tokens, so each ``next()`` runs in a worker
thread. Whatever way a reply ends early (the client disconnects, the task is
cancelled, sending fails), ``stream.cancel()`` is called so the runtime frees the
conversation's slot at once instead of generating for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
from starlette.requests import Request as HTTPRequest
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from ..errors import Cancelled, WarmstartError
from ..types import Done, Event, Report, Stream, Token, TokenLogprob, WatchedStream
from ..types import Message as ChatMessage
from ._errors import error_body
from ._replies import Shape

log = logging.getLogger(__name__)


def _next(iterator: Iterator[Event]) -> Event | None:
    return next(iterator, None)


async def events(stream: Stream, limiter: anyio.CapacityLimiter) -> AsyncIterator[Event]:
    """The stream's events; cancels the stream unless it was read to its Done.

    A WatchedStream is read on the event loop itself, woken by its producer after
    each event. Any other stream's ``next()`` runs in a worker thread; that is two
    more thread wake-ups a token, and on a machine whose cores all run llama.cpp's
    threads each wake-up preempts one of them while the others wait for it."""
    next_event, unwatch = _reader(stream, limiter)
    done = False
    try:
        while not done:
            event = await next_event()
            if event is None:
                raise WarmstartError("the runtime's stream ended without a Done event")
            done = isinstance(event, Done)
            yield event
    finally:
        unwatch()
        if not done:
            stream.cancel()


Reader = tuple[Callable[[], Awaitable[Event | None]], Callable[[], None]]


def _reader(stream: Stream, limiter: anyio.CapacityLimiter) -> Reader:
    """How ``events`` takes the next event (None: the stream ended without a Done),
    and what stops the watching once it is done."""
    loop = _running_asyncio_loop()
    if not isinstance(stream, WatchedStream) or loop is None:
        iterator = iter(stream)

        async def in_thread() -> Event | None:
            # abandon_on_cancel: a disconnect must not wait for the next token.
            return await anyio.to_thread.run_sync(
                _next, iterator, abandon_on_cancel=True, limiter=limiter
            )

        return in_thread, lambda: None
    watched, ready = stream, asyncio.Event()

    def wake() -> None:  # on the producer's thread
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody reads
            loop.call_soon_threadsafe(ready.set)

    async def polled() -> Event | None:
        while True:
            ready.clear()  # before the poll: an event put after it sets it again
            event = watched.poll()
            if event is not None:
                return event
            await ready.wait()

    watched.watch(wake)
    return polled, lambda: watched.watch(None)


def _running_asyncio_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # another event loop than asyncio's
        return None


@dataclass
class Reply:
    """A whole reply: its text, its tokens' log-probabilities (when asked), its report,
    and, for a request with tools, the turn read back from it (text and calls)."""

    text: str
    logprobs: list[TokenLogprob]
    report: Report
    turn: ChatMessage | None = None


async def collect(
    request: HTTPRequest, stream: Stream, limiter: anyio.CapacityLimiter
) -> tuple[str, Report]:
    """The whole reply's text and report (see :func:`gather`)."""
    reply = await gather(request, stream, limiter)
    return reply.text, reply.report


async def gather(request: HTTPRequest, stream: Stream, limiter: anyio.CapacityLimiter) -> Reply:
    """The whole reply; a client that disconnects while waiting cancels the stream
    (and gets Cancelled raised here, which nobody is left to read)."""
    parts: list[str] = []
    logprobs: list[TokenLogprob] = []
    done: Done | None = None
    failure: BaseException | None = None

    async with anyio.create_task_group() as group:

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            log.info("client disconnected; cancelling its generation")
            group.cancel_scope.cancel()

        group.start_soon(watch)
        try:
            async for event in events(stream, limiter):
                if isinstance(event, Token):
                    parts.append(event.text)
                    logprobs.extend(event.logprobs)
                else:
                    done = event
        except Exception as exc:  # re-raised below, not wrapped in an ExceptionGroup
            failure = exc
        group.cancel_scope.cancel()
    if failure is not None:
        raise failure
    if done is None:
        raise Cancelled("the client disconnected")
    return Reply("".join(parts), logprobs, done.report, done.reply)


def _sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n"


async def sse_chunks(
    stream: Stream,
    shape: Shape,
    limiter: anyio.CapacityLimiter,
    *,
    include_usage: bool,
    on_done: Callable[[Report], None],
) -> AsyncGenerator[str, None]:
    """The SSE body: a role chunk (chat), a chunk per token, the finishing chunk
    (always with usage and x_warmstart), the usage chunk if asked, then [DONE].
    A reply read back as tool calls is held until it is whole, then sent as its
    text and its calls."""
    if shape.kind == "chat":
        yield _sse(shape.chunk(None))
    try:
        async for event in events(stream, limiter):
            if isinstance(event, Token):
                if not shape.tools:
                    yield _sse(shape.chunk(event.text, logprobs=event.logprobs))
                continue
            on_done(event.report)
            if shape.tools and event.reply is not None:
                for chunk in shape.tool_call_chunks(event.reply):
                    yield _sse(chunk)
            yield _sse(shape.last_chunk(event.report, event.reply))
            if include_usage:
                yield _sse(shape.usage_chunk(event.report))
    except Exception as exc:  # any failure: the client must still see the stream end
        # The status line is already sent; OpenAI's clients raise on an error event.
        log.error("generation failed mid-stream: %s", exc, exc_info=exc)
        yield _sse(error_body(str(exc), "server_error"))
    yield _sse("[DONE]")


QUEUE_POLL_S = 0.25


def unsent_bytes(sock: socket.socket) -> int | None:
    """Bytes in the socket's kernel send queue not yet acknowledged by the peer
    (Linux's TIOCOUTQ/SIOCOUTQ); None where that cannot be asked."""
    try:
        import fcntl
        import termios

        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    return int(struct.unpack("i", raw)[0])


class StreamedReply(StreamingResponse):
    """A reply streamed as it is generated (SSE events, NDJSON lines: a subclass
    gives the media type and makes the body with ``_begin``). However it ends, a
    stream not read to its Done is cancelled and the body generator closed, so the
    runtime frees the slot now.

    Two ways a client leaves: it disconnects (watched for while the reply is
    computed, prefill included, not only when the next token is sent), or it stops
    reading with its socket open: the kernel's send queue then holds bytes that never
    drain, and ``send_timeout`` seconds of that end the reply (where the queue cannot
    be asked, a send that waits longer than ``send_timeout`` once the buffers are full
    does)."""

    def _begin(
        self,
        stream: Stream,
        chunks: Callable[[Callable[[Report], None]], AsyncGenerator[str, None]],
        on_done: Callable[[Report], None],
        send_timeout: float,
        sock: socket.socket | None,
    ) -> None:
        """What every streamed reply shares: ``chunks(finished)`` makes the body, and
        calls ``finished`` with the report once the stream reached its Done."""
        self._stream = stream
        self._done = False
        self._send_timeout = send_timeout
        self._sock = sock

        def finished(report: Report) -> None:
            self._done = True
            on_done(report)

        self._chunks = chunks(finished)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        StreamingResponse.__init__(self, self._chunks, headers=headers)

    async def _watch_queue(self, scope: anyio.CancelScope) -> None:
        """A reader who stopped leaves bytes in the kernel's send queue that never
        drain; a slow one drains them, however slowly. Ends the reply when the queue
        has held bytes without shrinking for ``send_timeout`` seconds, long before
        the socket buffers fill at a few kilobytes of tokens a second."""
        assert self._sock is not None
        stalled, last = 0.0, 0
        while True:
            await anyio.sleep(QUEUE_POLL_S)
            queued = unsent_bytes(self._sock)
            if queued is None:
                return  # not measurable here: the send timeout still applies
            stalled = stalled + QUEUE_POLL_S if queued and queued >= last else 0.0
            last = queued
            if stalled >= self._send_timeout:
                log.info("the client stopped reading; cancelling its generation")
                scope.cancel()
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def timed_send(message: Message) -> None:
            with anyio.fail_after(self._send_timeout):
                await send(message)

        # Where the kernel's send queue can be asked, its watcher ends a reply whose
        # reader stopped (a send blocked on full buffers included), and each token's
        # send goes without a timer of its own: a timer a token is event-loop work
        # that, on a machine whose cores all run llama.cpp's threads, delays a decode.
        queue_watched = self._sock is not None and unsent_bytes(self._sock) is not None
        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    log.info("client disconnected; cancelling its generation")
                    group.cancel_scope.cancel()

                group.start_soon(watch)
                if queue_watched:
                    group.start_soon(self._watch_queue, group.cancel_scope)
                try:
                    await self.stream_response(send if queue_watched else timed_send)
                except OSError as exc:  # TimeoutError too: the client stopped reading
                    log.info("cannot send to the client (%s); cancelling its generation", exc)
                group.cancel_scope.cancel()
        finally:
            if not self._done:
                log.info("stream ended early (client gone?); cancelling its generation")
                self._stream.cancel()
            with anyio.CancelScope(shield=True):
                await self._chunks.aclose()


class SSEResponse(StreamedReply):
    """A text/event-stream reply of OpenAI's chunks (see StreamedReply)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        stream: Stream,
        shape: Shape,
        limiter: anyio.CapacityLimiter,
        *,
        include_usage: bool,
        on_done: Callable[[Report], None],
        send_timeout: float = 5.0,
        sock: socket.socket | None = None,
    ) -> None:
        def chunks(finished: Callable[[Report], None]) -> AsyncGenerator[str, None]:
            return sse_chunks(stream, shape, limiter, include_usage=include_usage, on_done=finished)

        self._begin(stream, chunks, on_done, send_timeout, sock)
