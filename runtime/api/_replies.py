"""The JSON shapes of replies: whole (``chat.completion``, ``text_completion``) and
streamed chunks (``chat.completion.chunk``), with usage and the ``x_warmstart`` block."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from ..types import Report


def usage(report: Report) -> dict[str, Any]:
    """OpenAI's usage object; cached_tokens counts prompt tokens restored from any tier."""
    return {
        "prompt_tokens": report.prompt_tokens,
        "completion_tokens": report.completion_tokens,
        "total_tokens": report.prompt_tokens + report.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": report.cached_tokens},
    }


def finish_reason(report: Report) -> str:
    # "cancelled" only reaches a client that is gone; OpenAI knows stop and length.
    return "length" if report.finish_reason == "length" else "stop"


@dataclass
class Shape:
    """Builds the bodies of one reply; ``kind`` chooses chat or raw completion."""

    kind: Literal["chat", "completion"]
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def _head(self, obj: str) -> dict[str, Any]:
        prefix = "chatcmpl-" if self.kind == "chat" else "cmpl-"
        return {
            "id": prefix + self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }

    def whole(self, text: str, report: Report) -> dict[str, Any]:
        """The non-streamed reply."""
        if self.kind == "chat":
            body = self._head("chat.completion")
            message = {"role": "assistant", "content": text}
            choice: dict[str, Any] = {"index": 0, "message": message}
        else:
            body = self._head("text_completion")
            choice = {"index": 0, "text": text}
        choice.update(logprobs=None, finish_reason=finish_reason(report))
        body["choices"] = [choice]
        body["usage"] = usage(report)
        body["x_warmstart"] = report.as_dict()
        return body

    def chunk(self, text: str | None, finish: str | None = None) -> dict[str, Any]:
        """One streamed chunk; ``text=None`` on the chat's first chunk sends the role."""
        if self.kind == "chat":
            body = self._head("chat.completion.chunk")
            delta = {"role": "assistant", "content": ""} if text is None else {"content": text}
            if finish is not None:
                delta = {}
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            body = self._head("text_completion")
            choice = {"index": 0, "text": text or ""}
        choice.update(logprobs=None, finish_reason=finish)
        body["choices"] = [choice]
        return body

    def last_chunk(self, report: Report) -> dict[str, Any]:
        """The chunk carrying finish_reason; warmstart always adds usage and x_warmstart."""
        body = self.chunk(None, finish_reason(report))
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
