"""The Ollama dialect's wire details: reply bodies, NDJSON streaming, the error shape.

Ollama streams one JSON object per line (``application/x-ndjson``): a line per
token (a reply with tools: one line with its text and calls), then a last line
with ``done: true``, the timings (nanoseconds) and here warmstart's cache report
(``cached_tokens``, ``x_warmstart``). Its errors are ``{"error": "message"}``, a
string where OpenAI has an object.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import socket
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from ..types import Done, Report, Stream, Token, ToolCall
from ..types import Message as ChatMessage
from ._middleware import ErrorBodyMiddleware
from ._ollama_tools import tool_calls_json
from ._sse import StreamedReply, events

log = logging.getLogger(__name__)
API_PREFIX = "/api/"
_NS_PER_MS = 1_000_000


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def timings(report: Report) -> dict[str, Any]:
    """Ollama's counts and durations, and warmstart's cache report beside them."""
    prompt_ms = report.restore_ms + report.prefill_ms
    return {
        "total_duration": int(report.total_ms * _NS_PER_MS),
        "load_duration": 0,  # the model stays loaded; restoring KV counts as prompt eval
        "prompt_eval_count": report.prompt_tokens,
        "prompt_eval_duration": int(prompt_ms * _NS_PER_MS),
        "eval_count": report.completion_tokens,
        "eval_duration": int(max(0.0, report.total_ms - report.ttft_ms) * _NS_PER_MS),
        "cached_tokens": report.cached_tokens,
        "x_warmstart": report.as_dict(),
    }


def done_reason(report: Report) -> str:
    return "length" if report.finish_reason == "length" else "stop"


@dataclass
class OllamaShape:
    """Builds the bodies of one reply; ``kind`` chooses /api/chat or /api/generate.
    ``tools``: the reply is read back as text and tool calls, so it is streamed once
    whole (its raw text may be the JSON of a call), as on /v1."""

    kind: Literal["chat", "generate"]
    model: str
    tools: bool = False

    def part(self, text: str, calls: tuple[ToolCall, ...] = ()) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "created_at": now()}
        if self.kind == "chat":
            body["message"] = {"role": "assistant", "content": text}
            if calls:
                body["message"]["tool_calls"] = tool_calls_json(calls)
        else:
            body["response"] = text
        body["done"] = False
        return body

    def final(self, text: str, report: Report, reply: ChatMessage | None = None) -> dict[str, Any]:
        """The last line of a stream (``text`` empty) or the whole reply (``reply``:
        the output read back as text and calls, when tools were offered)."""
        body = self.part(reply.content, reply.tool_calls) if reply is not None else self.part(text)
        body.update(done=True, done_reason=done_reason(report), **timings(report))
        return body

    def loaded(self, reason: Literal["load", "unload"] = "load") -> dict[str, Any]:
        """Ollama's answer to an empty prompt: the model is loaded (or, with
        keep_alive 0, unloaded), nothing generated."""
        body = self.part("")
        body.update(done=True, done_reason=reason)
        return body


def _line(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":")) + "\n"


async def ndjson_lines(
    stream: Stream,
    shape: OllamaShape,
    limiter: anyio.CapacityLimiter,
    on_done: Callable[[Report], None],
) -> AsyncGenerator[str, None]:
    try:
        async for event in events(stream, limiter):
            if isinstance(event, Token):
                if not shape.tools:
                    yield _line(shape.part(event.text))
            elif isinstance(event, Done):
                on_done(event.report)
                if shape.tools and event.reply is not None:
                    reply = event.reply
                    yield _line(shape.part(reply.content, reply.tool_calls))
                yield _line(shape.final("", event.report))
    except Exception as exc:  # the status line is sent: Ollama's clients read an error line
        log.error("generation failed mid-stream: %s", exc, exc_info=exc)
        yield _line({"error": str(exc)})


class NDJSONResponse(StreamedReply):
    """Ollama's reply as NDJSON lines, with StreamedReply's handling of clients that
    leave (disconnect, stop reading) and of cancelling the generation."""

    media_type = "application/x-ndjson"

    def __init__(
        self,
        stream: Stream,
        shape: OllamaShape,
        limiter: anyio.CapacityLimiter,
        *,
        on_done: Callable[[Report], None],
        send_timeout: float = 5.0,
        sock: socket.socket | None = None,
    ) -> None:
        def chunks(finished: Callable[[Report], None]) -> AsyncGenerator[str, None]:
            return ndjson_lines(stream, shape, limiter, finished)

        self._begin(stream, chunks, on_done, send_timeout, sock)


class OllamaErrorMiddleware(ErrorBodyMiddleware):
    """The error bodies of /api/ routes in Ollama's ``{"error": "..."}``, which its
    clients show as the message."""

    def applies(self, path: str) -> bool:
        return path.startswith(API_PREFIX)

    def reshape(self, status: int, raw: bytes) -> tuple[bytes, bytes | None]:
        try:
            error = json.loads(raw)["error"]
        except (ValueError, KeyError, TypeError):  # not ours: pass it on as it was
            return raw, None
        return (
            json.dumps({"error": error["message"]}).encode() if isinstance(error, dict) else raw
        ), None
