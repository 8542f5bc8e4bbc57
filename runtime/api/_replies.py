"""The JSON shapes of replies: whole (``chat.completion``, ``text_completion``) and
streamed chunks (``chat.completion.chunk``), with usage and the ``x_warmstart`` block."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..types import Message, Report, TokenLogprob, ToolCall


def usage(report: Report) -> dict[str, Any]:
    """OpenAI's usage object; cached_tokens counts prompt tokens restored from any tier."""
    return {
        "prompt_tokens": report.prompt_tokens,
        "completion_tokens": report.completion_tokens,
        "total_tokens": report.prompt_tokens + report.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": report.cached_tokens},
    }


def finish_reason(report: Report, reply: Message | None = None) -> str:
    # "cancelled" only reaches a client that is gone; OpenAI knows stop and length.
    if reply is not None and reply.tool_calls:
        return "tool_calls"
    return "length" if report.finish_reason == "length" else "stop"


def tool_calls_json(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


def message_json(m: Message) -> dict[str, Any]:
    """A message in OpenAI's shape (null content on a turn that only calls tools)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = tool_calls_json(m.tool_calls)
        out["content"] = m.content or None
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


# OpenAI's stand-in for a log-probability too small to show (JSON has no -Infinity)
FLOOR = -9999.0


def _alternative(lp: TokenLogprob) -> dict[str, Any]:
    return {"token": lp.token, "logprob": max(lp.logprob, FLOOR), "bytes": list(lp.raw)}


@dataclass
class Shape:
    """Builds the bodies of one reply; ``kind`` chooses chat or raw completion.
    ``logprobs``: the client asked for them (chat: OpenAI's ``logprobs.content``; raw
    completions: the legacy lists, ``text_offset`` counted from the prompt's start)."""

    kind: Literal["chat", "completion"]
    model: str
    # the reply is read back (tool calls and/or text): streamed once whole, not token
    # by token, since its raw text may be the JSON of a call
    tools: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    logprobs: bool = False
    prompt_chars: int = 0
    _offset: int = field(default=0, init=False)  # characters of the reply's tokens so far

    def _logprobs(self, entries: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if self.kind == "chat":
            content = [
                {**_alternative(lp), "top_logprobs": [_alternative(a) for a in lp.top]}
                for lp in entries
            ]
            return {"content": content, "refusal": None}
        offsets = []
        for lp in entries:
            offsets.append(self.prompt_chars + self._offset)
            self._offset += len(lp.token)
        return {
            "tokens": [lp.token for lp in entries],
            "token_logprobs": [max(lp.logprob, FLOOR) for lp in entries],
            "top_logprobs": [{a.token: max(a.logprob, FLOOR) for a in lp.top} for lp in entries],
            "text_offset": offsets,
        }

    def _head(self, obj: str) -> dict[str, Any]:
        prefix = "chatcmpl-" if self.kind == "chat" else "cmpl-"
        return {
            "id": prefix + self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }

    def whole(
        self,
        text: str,
        report: Report,
        reply: Message | None = None,
        logprobs: Sequence[TokenLogprob] = (),
    ) -> dict[str, Any]:
        """The non-streamed reply; ``reply``: the output read back as tool calls."""
        if self.kind == "chat":
            body = self._head("chat.completion")
            message = message_json(reply or Message("assistant", text))
            choice: dict[str, Any] = {"index": 0, "message": message}
        else:
            body = self._head("text_completion")
            choice = {"index": 0, "text": text}
        choice.update(logprobs=self._logprobs(logprobs), finish_reason=finish_reason(report, reply))
        body["choices"] = [choice]
        body["usage"] = usage(report)
        body["x_warmstart"] = report.as_dict()
        return body

    def chunk(
        self,
        text: str | None,
        finish: str | None = None,
        logprobs: Sequence[TokenLogprob] | None = None,
    ) -> dict[str, Any]:
        """One streamed chunk; ``text=None`` on the chat's first chunk sends the role;
        ``logprobs``: the tokens decoded for it (None on the role and finishing chunks)."""
        if self.kind == "chat":
            body = self._head("chat.completion.chunk")
            delta = {"role": "assistant", "content": ""} if text is None else {"content": text}
            if finish is not None:
                delta = {}
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            body = self._head("text_completion")
            choice = {"index": 0, "text": text or ""}
        shown = None if logprobs is None else self._logprobs(logprobs)
        choice.update(logprobs=shown, finish_reason=finish)
        body["choices"] = [choice]
        return body

    def tool_call_chunks(self, reply: Message) -> list[dict[str, Any]]:
        """A reply read back as tool calls, streamed: its text (if any), then one delta
        per call carrying the whole call, as OpenAI clients accumulate them."""
        chunks = [self.chunk(reply.content)] if reply.content else []
        for index, call in enumerate(tool_calls_json(reply.tool_calls)):
            body = self.chunk(None)
            body["choices"][0]["delta"] = {"tool_calls": [{"index": index, **call}]}
            chunks.append(body)
        return chunks

    def last_chunk(self, report: Report, reply: Message | None = None) -> dict[str, Any]:
        """The chunk carrying finish_reason; warmstart always adds usage and x_warmstart."""
        body = self.chunk(None, finish_reason(report, reply))
        body["usage"] = usage(report)
        body["x_warmstart"] = report.as_dict()
        return body

    def usage_chunk(self, report: Report) -> dict[str, Any]:
        """The extra chunk that ``stream_options.include_usage`` asks for (no choices)."""
        body = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        body["choices"] = []
        body["usage"] = usage(report)
        body["x_warmstart"] = report.as_dict()
        return body
