"""The Messages API's wire details: the reply body, its streamed events, its errors.

A reply is a ``message`` whose ``content`` is a list of blocks (``text``, and
``tool_use`` with its ``input`` as an object). Streamed, it is named SSE events:
``message_start``, then per block ``content_block_start``, its deltas
(``text_delta`` per token; a tool call's whole input as one ``input_json_delta``,
held until the reply is read back, as the chat route holds its calls) and
``content_block_stop``, then ``message_delta`` (stop_reason and usage) and
``message_stop``. Usage counts the prompt as Anthropic does: ``input_tokens`` are
the tokens computed, ``cache_read_input_tokens`` those restored from warmstart's
cache (any tier); both are known once the reply is done, so ``message_start``
carries zeros and ``message_delta`` the totals (the clients overwrite with them).
Errors are ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
import logging
import socket
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..engine import arguments_value
from ..types import Done, Report, Stream, Token, ToolCall
from ..types import Message as ChatMessage
from ._middleware import ErrorBodyMiddleware
from ._sse import SSEResponse, events

log = logging.getLogger(__name__)
MESSAGES_PATH = "/v1/messages"


def usage(report: Report | None) -> dict[str, int]:
    """Anthropic's usage: the prompt split into computed and restored tokens (warmstart
    writes what it computes to its cache at no extra cost: no cache_creation)."""
    if report is None:
        return {
            "input_tokens": 0,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
    return {
        "input_tokens": report.prefilled_tokens,
        "output_tokens": report.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": report.cached_tokens,
    }


def stop_reason(report: Report, reply: ChatMessage | None) -> str:
    if reply is not None and reply.tool_calls:
        return "tool_use"
    if report.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if report.stop_sequence is not None else "end_turn"


def _input(call: ToolCall) -> dict[str, Any]:
    """A call's input as an object; arguments that are not one (a native template's
    odd output) are kept whole rather than lost."""
    value = arguments_value(call.arguments)
    return value if isinstance(value, dict) else {"arguments": value}


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call)}


def _blocks(text: str, reply: ChatMessage | None) -> list[dict[str, Any]]:
    """The reply's content: its text (always, when it calls nothing), then its calls."""
    turn = reply or ChatMessage("assistant", text)
    blocks = [{"type": "text", "text": turn.content}] if turn.content or not turn.tool_calls else []
    return blocks + [tool_use_block(call) for call in turn.tool_calls]


@dataclass
class MessageShape:
    """Builds the bodies of one reply."""

    model: str
    tools: bool = False  # the reply is read back: its blocks are sent once whole
    id: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex[:24])

    def _message(self, content: list[dict[str, Any]], report: Report | None) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(report),
        }

    def whole(self, text: str, report: Report, reply: ChatMessage | None) -> dict[str, Any]:
        body = self._message(_blocks(text, reply), report)
        body["stop_reason"] = stop_reason(report, reply)
        body["stop_sequence"] = report.stop_sequence
        body["x_warmstart"] = report.as_dict()
        return body

    def start(self) -> dict[str, Any]:
        return {"type": "message_start", "message": self._message([], None)}

    def end(self, report: Report, reply: ChatMessage | None) -> dict[str, Any]:
        delta = {"stop_reason": stop_reason(report, reply), "stop_sequence": report.stop_sequence}
        return {
            "type": "message_delta",
            "delta": delta,
            "usage": usage(report),
            "x_warmstart": report.as_dict(),
        }


def block_events(index: int, block: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A whole block as its start, one delta and its stop."""
    if block["type"] == "text":
        yield {"type": "content_block_start", "index": index, "content_block": _empty_text()}
        if block["text"]:
            delta = {"type": "text_delta", "text": block["text"]}
            yield {"type": "content_block_delta", "index": index, "delta": delta}
    else:
        start = {**block, "input": {}}
        yield {"type": "content_block_start", "index": index, "content_block": start}
        partial = json.dumps(block["input"], ensure_ascii=False)
        delta = {"type": "input_json_delta", "partial_json": partial}
        yield {"type": "content_block_delta", "index": index, "delta": delta}
    yield {"type": "content_block_stop", "index": index}


def _empty_text() -> dict[str, Any]:
    return {"type": "text", "text": ""}


def _event(data: dict[str, Any]) -> str:
    return f"event: {data['type']}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def error_event(message: str, kind: str = "api_error") -> str:
    return _event({"type": "error", "error": {"type": kind, "message": message}})


async def message_events(
    stream: Stream,
    shape: MessageShape,
    limiter: anyio.CapacityLimiter,
    on_done: Callable[[Report], None],
) -> AsyncGenerator[str, None]:
    """The SSE body of one reply (see the module docstring)."""
    yield _event(shape.start())
    if not shape.tools:  # text streams as it is decoded
        yield _event({"type": "content_block_start", "index": 0, "content_block": _empty_text()})
    yield _event({"type": "ping"})
    try:
        async for event in events(stream, limiter):
            if isinstance(event, Token):
                if not shape.tools and event.text:
                    delta = {"type": "text_delta", "text": event.text}
                    yield _event({"type": "content_block_delta", "index": 0, "delta": delta})
                continue
            assert isinstance(event, Done)
            on_done(event.report)
            if shape.tools:
                for index, block in enumerate(_blocks("", event.reply)):
                    for data in block_events(index, block):
                        yield _event(data)
            else:
                yield _event({"type": "content_block_stop", "index": 0})
            yield _event(shape.end(event.report, event.reply))
            yield _event({"type": "message_stop"})
    except Exception as exc:  # the status line is sent: Anthropic's clients raise on this
        log.error("generation failed mid-stream: %s", exc, exc_info=exc)
        yield error_event(str(exc))


class MessagesSSEResponse(SSEResponse):
    """SSEResponse's handling of clients that leave, around Anthropic's events."""

    def __init__(
        self,
        stream: Stream,
        shape: MessageShape,
        limiter: anyio.CapacityLimiter,
        *,
        on_done: Callable[[Report], None],
        send_timeout: float = 5.0,
        sock: socket.socket | None = None,
    ) -> None:
        def chunks(finished: Callable[[Report], None]) -> AsyncGenerator[str, None]:
            return message_events(stream, shape, limiter, finished)

        self._begin(stream, chunks, on_done, send_timeout, sock)


# Anthropic's error types by status; other 4xx are invalid requests, 5xx api errors
ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def is_messages_path(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


class AnthropicErrorMiddleware(ErrorBodyMiddleware):
    """The error bodies of /v1/messages in Anthropic's shape, which its clients raise
    as typed errors."""

    def applies(self, path: str) -> bool:
        return is_messages_path(path)

    def reshape(self, status: int, raw: bytes) -> tuple[bytes, bytes | None]:
        return _reshape(status, raw), b"application/json"


def _reshape(status: int, raw: bytes) -> bytes:
    try:
        error = json.loads(raw)["error"]
        message = error["message"] if isinstance(error, dict) else str(error)
    except (ValueError, KeyError, TypeError):  # not an error body of ours: a plain one
        message = raw.decode("utf-8", "replace") or f"HTTP {status}"
    body = {"type": "error", "error": {"type": error_type(status), "message": message}}
    return json.dumps(body).encode()
