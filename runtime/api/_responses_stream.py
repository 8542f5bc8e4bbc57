"""A Responses API reply streamed as OpenAI's typed events (``event:`` and ``data:``
lines), on SSEResponse's handling of clients that leave. Text is sent token by token;
a reply read back as tool calls is held until it is whole, then sent as its items."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import anyio

from ..types import Message, Report, Stream, Token
from ._responses_shape import Events
from ._sse import SSEResponse, events

log = logging.getLogger(__name__)

# builds the whole response once the reply is done (and keeps it when asked)
Finish = Callable[[str, Report, Message | None], Awaitable[dict[str, Any]]]


def _sse(data: dict[str, Any]) -> str:
    return f"event: {data['type']}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _items(ev: Events, body: dict[str, Any], text_open: bool, tools: bool) -> list[dict[str, Any]]:
    """The events that close the reply's output items (and, for a reply held whole,
    announce them and carry their text first)."""
    out: list[dict[str, Any]] = []
    for index, item in enumerate(body["output"]):
        if item["type"] != "message":
            out += ev.call(index, item)
            continue
        if not text_open:
            out += ev.text_opening(index)
        text = item["content"][0]["text"] if item["content"] else ""
        if tools and text:
            out.append(ev.delta(index, text))
        out += ev.text_closing(index, item)
    return out


async def response_events(
    stream: Stream,
    ev: Events,
    limiter: anyio.CapacityLimiter,
    *,
    tools: bool,
    finish: Finish,
    on_done: Callable[[Report], None],
) -> AsyncGenerator[str, None]:
    """created, in_progress, the text item opened (no tools), a delta per token, the
    items closed, then completed (or incomplete: max_output_tokens). A failure once
    the stream has begun ends it with ``response.failed``."""
    for opening in ev.opening():
        yield _sse(opening)
    if not tools:
        for opening in ev.text_opening(0):
            yield _sse(opening)
    parts: list[str] = []
    try:
        async for event in events(stream, limiter):
            if isinstance(event, Token):
                if not tools and event.text:
                    parts.append(event.text)
                    yield _sse(ev.delta(0, event.text))
                continue
            on_done(event.report)
            body = await finish("".join(parts), event.report, event.reply)
            for item in _items(ev, body, not tools, tools):
                yield _sse(item)
            yield _sse(ev.closing(body))
    except Exception as exc:  # the status line is sent: the failure is an event
        log.error("generation failed mid-stream: %s", exc, exc_info=exc)
        yield _sse(ev.failed(str(exc)))


class ResponseEventsResponse(SSEResponse):
    """SSEResponse with the Responses API's events for a body."""

    def __init__(
        self,
        stream: Stream,
        ev: Events,
        limiter: anyio.CapacityLimiter,
        *,
        tools: bool,
        finish: Finish,
        on_done: Callable[[Report], None],
        send_timeout: float = 5.0,
        sock: socket.socket | None = None,
    ) -> None:
        def chunks(finished: Callable[[Report], None]) -> AsyncGenerator[str, None]:
            return response_events(
                stream, ev, limiter, tools=tools, finish=finish, on_done=finished
            )

        self._begin(stream, chunks, on_done, send_timeout, sock)
